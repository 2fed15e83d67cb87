//! Copying a shuffled batch's rows, a few at a time.
//!
//! Why: the rows of a shuffled batch (3 KiB of `x` per context in the IceCube cache) each start
//! on cold cache lines. Copied one after another, each row waits for its first lines before the
//! hardware prefetchers pick up its stream, so a core keeps few misses in flight and gathers at
//! under half of memcpy's rate. Copying `GROUP` rows side by side, a cache line of each in turn,
//! keeps that many streams going at once, and touching the first lines of the next group's rows
//! starts their misses before the copy reaches them. Measured on the 2-core machine of
//! `docs/PERFORMANCE.md` ("Gathering rows side by side"): +13 % with one loader thread and with
//! two; groups of 8 or 16 rows were slower than 4 (more streams than the prefetchers track).

/// Rows copied side by side.
const GROUP: usize = 4;
/// Lines of each of the next group's rows touched ahead.
const AHEAD_LINES: usize = 2;
const LINE: usize = 64;

/// Copies `count` rows of `len` bytes into `dst` (row `i` at `i * len`), row `i` from
/// `src(i)` (exactly `len` bytes).
pub(crate) fn gather<'a>(
    dst: &mut [u8],
    len: usize,
    count: usize,
    src: impl Fn(usize) -> &'a [u8],
) {
    assert_eq!(
        dst.len(),
        len * count,
        "gather into a buffer of the wrong size"
    );
    if len < 2 * LINE {
        // A line or two per row: nothing to overlap that the out-of-order core does not
        // already overlap across rows.
        for (i, row) in dst.chunks_exact_mut(len.max(1)).enumerate().take(count) {
            row.copy_from_slice(src(i));
        }
        return;
    }
    for (g, group) in dst.chunks_mut(GROUP * len).enumerate() {
        let first = g * GROUP;
        for next in (first + GROUP..first + 2 * GROUP).take_while(|&i| i < count) {
            touch_ahead(&src(next)[..AHEAD_LINES * LINE]);
        }
        let rows = group.len() / len;
        let mut sources = [&[][..]; GROUP];
        for (k, s) in sources.iter_mut().enumerate().take(rows) {
            *s = src(first + k);
            assert_eq!(s.len(), len, "source row of the wrong size");
        }
        copy_side_by_side(group, len, &sources[..rows]);
    }
}

/// Copies `sources[k]` to `dst[k * len..]`, a cache line of each in turn.
fn copy_side_by_side(dst: &mut [u8], len: usize, sources: &[&[u8]]) {
    let whole = len / LINE * LINE;
    for at in (0..whole).step_by(LINE) {
        for (k, s) in sources.iter().enumerate() {
            let to = k * len + at;
            dst[to..to + LINE].copy_from_slice(&s[at..at + LINE]);
        }
    }
    for (k, s) in sources.iter().enumerate() {
        dst[k * len + whole..(k + 1) * len].copy_from_slice(&s[whole..]);
    }
}

/// Asks for `bytes`' cache lines ahead of their use (a hint: no effect on results).
fn touch_ahead(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(LINE) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch is a hint that never faults or changes memory; the address is
        // inside `bytes` anyway. SSE (which has it) is in every x86_64 target's baseline.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsc_format::rng::Xoshiro256;

    /// Every row lands at its place with its bytes, for row lengths around the line and group
    /// sizes, batch sizes that leave a partial group, and sources at any alignment.
    #[test]
    fn equals_copying_row_by_row() {
        let mut rng = Xoshiro256::seed_from(7);
        let pool: Vec<u8> = (0..64 << 10).map(|_| rng.below(256) as u8).collect();
        for len in [1, 4, 63, 64, 127, 128, 129, 191, 200, 512, 3072, 3080] {
            for count in [0, 1, 3, 4, 5, 8, 9, 13] {
                let starts: Vec<usize> = (0..count)
                    .map(|_| rng.below((pool.len() - len) as u64) as usize)
                    .collect();
                let mut got = vec![0xA5; len * count];
                gather(&mut got, len, count, |i| &pool[starts[i]..starts[i] + len]);
                let want: Vec<u8> = starts
                    .iter()
                    .flat_map(|&s| pool[s..s + len].iter().copied())
                    .collect();
                assert_eq!(got, want, "len {len}, count {count}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "wrong size")]
    fn refuses_a_short_source_row() {
        let src = [0u8; 256];
        gather(&mut [0u8; 512], 256, 2, |i| &src[..256 - i]);
    }
}
