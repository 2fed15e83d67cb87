//! The shard order a loader hands to the fetchers of its sources in object storage: window by
//! window, so that each fetcher downloads ahead of use and evicts what no window still needs,
//! refused when a source's `cache_limit` cannot hold two windows' shards. Above both the
//! sources (`gather`) and the fetchers (`remote`), which know nothing of each other.

use crate::body::Body;
use crate::cache::Origin;
use crate::error::LoadError;
use crate::gather::Source;
use crate::order::Order;
use crate::remote::{Fetcher, PlanGuard};
use dsc_format::spelling::OptionError;

/// The order in which a loader reads each of its sources in object storage, handed to their
/// fetchers: window by window, this epoch's `order` from window `from`, then the next epoch's
/// (`next`, when it could be planned), so that the shards the next epoch starts with are
/// neither evicted at the end of this one nor fetched late. Empty when no source is remote.
///
/// Refused when a source's `cache_limit` cannot hold the shards of two consecutive windows
/// (the one being read and the one read ahead): every shard of a window is read through the
/// whole window, so a smaller limit would fetch shards again and again within it.
pub(crate) fn plans(
    sources: &[Source],
    order: &Order,
    next: Option<&Order>,
    from: usize,
) -> Result<Vec<PlanGuard>, LoadError> {
    let fetchers: Vec<Option<&Fetcher>> = sources
        .iter()
        .map(|s| match &s.cache.origin {
            Origin::Remote(f) => Some(f),
            Origin::Folder(_) => None,
        })
        .collect();
    if fetchers.iter().all(Option::is_none) {
        return Ok(Vec::new());
    }
    let mut uses: Vec<Vec<(usize, usize)>> = vec![Vec::new(); sources.len()];
    let mut add = |order: &Order, first: usize, offset: usize| {
        let w = order.window().max(1);
        let windows = order.len().div_ceil(w);
        for k in first..windows {
            for (source, shard, _, _) in order.spans(k * w..((k + 1) * w).min(order.len())) {
                if fetchers[source].is_none() {
                    continue;
                }
                let Body::Remote { id, .. } = sources[source].shards()[shard].body else {
                    unreachable!("a remote cache's shards are remote");
                };
                // A window's entries are together: a shard is listed once per window.
                let listed = uses[source]
                    .iter()
                    .rev()
                    .take_while(|(window, _)| *window == offset + k)
                    .any(|&(_, s)| s == id);
                if !listed {
                    uses[source].push((offset + k, id));
                }
            }
        }
        windows
    };
    let windows = add(order, from, 0);
    if let Some(next) = next {
        add(next, 0, windows);
    }
    for (source, (fetcher, uses)) in fetchers.iter().zip(&uses).enumerate() {
        let Some(f) = fetcher else { continue };
        let Some(limit) = f.limit() else { continue };
        let need = reach(uses, |id| f.stored_bytes(id));
        if need > limit {
            let format = dsc_format::spec::format_size;
            return Err(OptionError::new(
                "cache_limit",
                format!(
                    "{} is less than the {} of shards that two shuffle windows of {} read \
                     (the one being read and the next): within it shards would be fetched \
                     again and again; raise the limit, or lower `window` or `interleave`",
                    format(limit),
                    format(need),
                    sources[source].cache.dir.display()
                ),
            )
            .into());
        }
    }
    Ok(fetchers
        .into_iter()
        .zip(uses)
        .filter_map(|(f, uses)| f.map(|f| f.plan(uses, from)))
        .collect())
}

/// The most bytes of distinct shards that two consecutive windows of `uses` (`(window, shard)`
/// in order) read, shards weighing `bytes(id)`.
fn reach(uses: &[(usize, usize)], bytes: impl Fn(usize) -> u64) -> u64 {
    let mut most = 0;
    let mut start = 0;
    while start < uses.len() {
        let w = uses[start].0;
        let mut seen: Vec<usize> = uses[start..]
            .iter()
            .take_while(|(window, _)| *window <= w + 1)
            .map(|&(_, id)| id)
            .collect();
        seen.sort_unstable();
        seen.dedup();
        most = most.max(seen.iter().map(|&id| bytes(id)).sum());
        start += uses[start..]
            .iter()
            .take_while(|(window, _)| *window == w)
            .count();
    }
    most
}
