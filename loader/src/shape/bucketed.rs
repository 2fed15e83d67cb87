//! Bucketed batches: inside each window, contexts of similar stored length form a global batch
//! ([`crate::order::EpochOrder::bucketed`]), each trimmed to its longest sequence (exactly,
//! unless a `trim` multiple is given). One cache's windows: not with a mix. The batches are
//! padded ones, gathered by `padded`.

use super::padded::Padded;
use super::{Cut, Planning, Shape};
use crate::cache::Cache;
use crate::error::LoadError;
use crate::options::LoaderOptions;
use crate::order::{EpochOrder, Order, SplitContexts};
use dsc_format::spelling::OptionError;
use std::sync::Arc;

/// Bucketed batches of `p.opts`: checked against memory, over a bucketed order.
pub(crate) fn plan(p: &Planning<'_>) -> Result<Cut, LoadError> {
    let opts = p.opts;
    p.bound(
        p.rows_bytes(opts.batch_size, 0),
        ("batch_size", opts.batch_size),
    )?;
    let order = super::order(p, opts)?;
    let max_len = p.longest();
    let trim = Some(opts.trim.unwrap_or(1));
    Ok(Cut {
        shape: Shape::Bucketed(Padded::new(order.len(), opts, trim)),
        layout: p.stored_layout(opts.batch_size, max_len),
        order,
        max_len,
    })
}

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
    let order = EpochOrder::over(
        one.clone(),
        o.shuffle,
        o.seed,
        opts.epoch,
        o.window,
        o.interleave,
    );
    let lengths = sources[0].lengths(&o.split)?;
    Ok(Order::One(order.bucketed(lengths, opts.global_batch()?)))
}
