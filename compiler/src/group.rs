//! Grouping rows into per-context sequences: find runs of equal keys, sort the runs by key (so
//! contiguous input costs O(contexts) and scattered input one sort), order each sequence and
//! choose the rows kept under `max_len`.

use crate::column::{Column, Values};
use dsc_format::rng::{stream, Xoshiro256};
use dsc_format::spec::Truncate;
use rayon::prelude::*;
use std::cmp::Ordering;

/// One context's rows: `perm[start..start + len]` in sequence order, of which
/// `perm[kept_start..kept_start + kept]` are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Group {
    pub key: i64,
    pub start: usize,
    pub len: usize,
    pub kept_start: usize,
    pub kept: usize,
}

/// All contexts, ascending by key.
#[derive(Debug)]
pub(crate) struct Groups {
    /// Global row numbers, grouped by context.
    pub perm: Vec<u32>,
    pub groups: Vec<Group>,
}

/// Groups rows by `keys` (no nulls), each group's rows in file order.
pub(crate) fn by_key(keys: &[i64]) -> Groups {
    let mut runs: Vec<(i64, u32, u32)> = Vec::new();
    let mut i = 0;
    while i < keys.len() {
        let k = keys[i];
        let start = i;
        while i < keys.len() && keys[i] == k {
            i += 1;
        }
        runs.push((k, start as u32, (i - start) as u32));
    }
    if !runs.windows(2).all(|w| w[0].0 < w[1].0) {
        runs.par_sort_unstable_by_key(|&(k, start, _)| (k, start));
    }
    let mut perm = Vec::with_capacity(keys.len());
    let mut groups: Vec<Group> = Vec::new();
    for &(k, start, len) in &runs {
        if groups.last().is_none_or(|g| g.key != k) {
            groups.push(Group {
                key: k,
                start: perm.len(),
                len: 0,
                kept_start: perm.len(),
                kept: 0,
            });
        }
        perm.extend(start..start + len);
        let g = groups.last_mut().expect("pushed above");
        g.len += len as usize;
        g.kept = g.len;
    }
    Groups { perm, groups }
}

/// Orders each group's rows by `order` (ties and nulls keep file order; nulls last).
pub(crate) fn order_groups(groups: &mut Groups, order: &Column) {
    order_within(&mut groups.perm, &groups.groups, order);
}

fn cmp_rows(order: &Column, a: u32, b: u32) -> Ordering {
    let (a, b) = (a as usize, b as usize);
    let by_value = match (order.is_valid(a), order.is_valid(b)) {
        (true, true) => match &order.values {
            Values::Int(v) => v[a].cmp(&v[b]),
            Values::F64(v) => v[a].total_cmp(&v[b]),
            Values::F32(v) => v[a].total_cmp(&v[b]),
            _ => unreachable!("order-by columns are numeric; checked when opened"),
        },
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => Ordering::Equal,
    };
    by_value.then(a.cmp(&b))
}

fn order_within(perm: &mut [u32], groups: &[Group], order: &Column) {
    let mut slices: Vec<&mut [u32]> = Vec::with_capacity(groups.len());
    let mut rest = perm;
    for g in groups {
        let (head, tail) = rest.split_at_mut(g.len);
        slices.push(head);
        rest = tail;
    }
    slices.par_iter_mut().for_each(|rows| {
        let sorted = rows
            .windows(2)
            .all(|w| cmp_rows(order, w[0], w[1]) != Ordering::Greater);
        if !sorted {
            rows.sort_unstable_by(|&a, &b| cmp_rows(order, a, b));
        }
    });
}

/// Chooses the stored rows of every group longer than `max_len`; returns how many were cut.
pub(crate) fn truncate(groups: &mut Groups, max_len: usize, how: Truncate, seed: u64) -> usize {
    let mut cut = 0;
    let perm = &mut groups.perm;
    for g in groups.groups.iter_mut() {
        if g.len <= max_len {
            g.kept_start = g.start;
            g.kept = g.len;
            continue;
        }
        cut += 1;
        g.kept = max_len;
        match how {
            Truncate::Head => g.kept_start = g.start,
            Truncate::Tail => g.kept_start = g.start + g.len - max_len,
            Truncate::Sample => {
                // Pick `max_len` positions uniformly (seeded by key), keep them in sequence order
                // at the front of the group.
                let mut rng =
                    Xoshiro256::for_stream(seed ^ (g.key as u64), stream::TRUNCATE_SAMPLE);
                let mut positions: Vec<usize> = (0..g.len).collect();
                for i in 0..max_len {
                    let j = i + rng.below((g.len - i) as u64) as usize;
                    positions.swap(i, j);
                }
                let mut chosen = positions[..max_len].to_vec();
                chosen.sort_unstable();
                let rows = &mut perm[g.start..g.start + g.len];
                let mut picked: Vec<u32> = chosen.iter().map(|&p| rows[p]).collect();
                let mut is_chosen = vec![false; g.len];
                chosen.iter().for_each(|&p| is_chosen[p] = true);
                picked.extend((0..g.len).filter(|&p| !is_chosen[p]).map(|p| rows[p]));
                rows.copy_from_slice(&picked);
                g.kept_start = g.start;
            }
        }
    }
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_and_scattered_keys_group_alike() {
        let contiguous = [1, 1, 2, 2, 2, 5];
        let g = by_key(&contiguous);
        assert_eq!(g.perm, [0, 1, 2, 3, 4, 5]);
        assert_eq!(
            g.groups.iter().map(|g| (g.key, g.len)).collect::<Vec<_>>(),
            [(1, 2), (2, 3), (5, 1)]
        );
        let scattered = [5, 2, 1, 2, 1, 2];
        let g = by_key(&scattered);
        assert_eq!(
            g.groups.iter().map(|g| (g.key, g.len)).collect::<Vec<_>>(),
            [(1, 2), (2, 3), (5, 1)]
        );
        assert_eq!(g.perm, [2, 4, 1, 3, 5, 0]);
    }

    #[test]
    fn truncation_keeps_head_tail_or_ordered_sample() {
        let keys = [7; 10];
        for (how, expect) in [
            (Truncate::Head, vec![0, 1, 2]),
            (Truncate::Tail, vec![7, 8, 9]),
        ] {
            let mut g = by_key(&keys);
            assert_eq!(truncate(&mut g, 3, how, 0), 1);
            let k = g.groups[0];
            assert_eq!(g.perm[k.kept_start..k.kept_start + k.kept], expect[..]);
        }
        let mut g = by_key(&keys);
        truncate(&mut g, 4, Truncate::Sample, 1);
        let k = g.groups[0];
        let kept = &g.perm[k.kept_start..k.kept_start + k.kept];
        assert!(kept.windows(2).all(|w| w[0] < w[1]), "{kept:?}");
        let mut all = g.perm.clone();
        all.sort_unstable();
        assert_eq!(all, (0..10).collect::<Vec<u32>>());
    }
}
