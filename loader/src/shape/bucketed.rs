//! Bucketed batches: inside each window, contexts of similar stored length form a global batch
//! ([`crate::order::EpochOrder::bucketed`]), each trimmed to its longest sequence (exactly,
//! unless a `trim` multiple is given). One cache's windows: not with a mix. The batches are
//! padded ones, planned and gathered by `padded`; this is their order.

use crate::cache::Cache;
use crate::error::LoadError;
use crate::options::LoaderOptions;
use crate::order::{Order, SplitContexts};
use dsc_format::spelling::OptionError;
use std::sync::Arc;

/// The epoch's order of one cache's contexts, bucketed by length per window.
pub(crate) fn order(
    sources: &[Cache],
    sizes: &[Arc<SplitContexts>],
    opts: &LoaderOptions,
) -> Result<Order, LoadError> {
    let o = &opts.order;
    let [one] = sizes else {
        return Err(OptionError::new(
            "bucket",
            "cannot be used with a mix: buckets are cut from one cache's windows; use `trim` \
             (or `pack`) to cut padding",
        )
        .into());
    };
    let lengths = sources[0].lengths(&o.split)?;
    let order = crate::mix::epoch_order(one, opts);
    Ok(Order::One(order.bucketed(lengths, opts.global_batch()?)))
}
