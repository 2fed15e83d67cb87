//! The pseudo-random generators that every order in a cache depends on.
//!
//! These are written out here, not taken from `rand`, because a cache's shuffle and split are
//! part of its contract: the same seed must give the same order in every future release, and
//! `rand`'s generators and sampling methods are allowed to change between its versions.
//! The algorithms are specified in `docs/FORMAT.md` ("Randomness") with test vectors.

/// SplitMix64 (Steele, Lea, Flood 2014): used to expand a `u64` seed into generator state and to
/// hash keys for the train/validation split.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting at `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.state)
    }
}

/// The SplitMix64 output function: a bijective 64-bit mixer.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// xoshiro256** (Blackman, Vigna 2018), seeded by four SplitMix64 outputs.
#[derive(Debug, Clone)]
pub struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    /// A generator whose state is four successive SplitMix64 outputs starting at `seed`.
    pub fn seed_from(seed: u64) -> Self {
        let mut sm = SplitMix64::new(seed);
        let s = [sm.next_u64(), sm.next_u64(), sm.next_u64(), sm.next_u64()];
        Xoshiro256 { s }
    }

    /// A generator for one purpose of one seed: `stream` separates independent uses of the same
    /// user seed (compile shuffle, epoch order, …) so they never share a sequence.
    pub fn for_stream(seed: u64, stream: u64) -> Self {
        Self::seed_from(mix64(seed ^ mix64(stream)))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// A uniform integer in `0..bound` (`bound > 0`), without modulo bias: Lemire's
    /// multiply-shift with rejection.
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "below(0) has no values to draw from");
        let threshold = bound.wrapping_neg() % bound;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(bound);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// A uniform `f64` in `[0, 1)` from the top 53 bits.
    pub fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Fisher–Yates shuffle, from the last element down: element `i` swaps with `below(i + 1)`.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

/// Streams of randomness used by the compiler and loader; see [`Xoshiro256::for_stream`].
pub mod stream {
    /// The compile-time global shuffle of one split's contexts.
    pub const COMPILE_SHUFFLE: u64 = 1;
    /// Seeded sampling of rows for `--truncate sample`.
    pub const TRUNCATE_SAMPLE: u64 = 2;
    /// The loader's per-epoch order.
    pub const EPOCH_ORDER: u64 = 3;
    /// `--profile mostlyai`: the donor row drawn for a null value of a digit or datetime
    /// column (the engine's random imputation).
    pub const MOSTLYAI_IMPUTE: u64 = 4;
    /// The loader's length-bucketed batches: window `w`'s batches are permuted with stream
    /// `BUCKET_ORDER + w` (far from `EPOCH_ORDER + 1 + w`, the windows' own streams).
    pub const BUCKET_ORDER: u64 = 1 << 62;
    /// A mix of caches: block `b` of an epoch places its sources with stream
    /// `MIX_BLOCK + b` (far from the windows' and the buckets' streams).
    pub const MIX_BLOCK: u64 = 1 << 61;
    /// A mix of caches: source `s` reads its own epochs with the seed
    /// `mix64(seed ^ mix64(MIX_SOURCE + s))`.
    pub const MIX_SOURCE: u64 = 5;
}

/// The position of `key` in `[0, 1)` used for the train/validation split: a context is in the
/// validation split when this is below `val_fraction`. Depends only on the key and `split_seed`,
/// so it is the same whatever the shuffle seed, the files or their order.
pub fn split_unit(key: i64, split_seed: u64) -> f64 {
    let h = mix64((key as u64) ^ mix64(split_seed.wrapping_add(0x5851_F42D_4C95_7F2D)));
    (h >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A context's place in the stored order of its split (format version 2): a split's contexts are
/// stored ascending by this value, ties (two keys with one 64-bit hash) by key. It depends only
/// on the key and the shuffle seed, so the order is the same whoever read which file; its top
/// bits are the compile's bucket, so each bucket holds one contiguous stretch of every split.
pub fn position_hash(key: i64, seed: u64) -> u64 {
    mix64((key as u64) ^ mix64(seed ^ 0xD6E8_FEB8_6659_FD93))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Reference values from the published SplitMix64 and xoshiro256** C code; they pin the
    // algorithms so that a refactor cannot silently change every cache's order.
    #[test]
    fn splitmix_matches_reference() {
        let mut sm = SplitMix64::new(1234567);
        assert_eq!(sm.next_u64(), 6457827717110365317);
        assert_eq!(sm.next_u64(), 3203168211198807973);
    }

    #[test]
    fn xoshiro_matches_reference() {
        let mut x = Xoshiro256 { s: [1, 2, 3, 4] };
        let got: Vec<u64> = (0..4).map(|_| x.next_u64()).collect();
        assert_eq!(got, [11520, 0, 1509978240, 1215971899390074240]);
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut x = Xoshiro256::seed_from(9);
        let mut counts = [0u32; 7];
        for _ in 0..70_000 {
            counts[x.below(7) as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn shuffle_is_a_permutation_and_seeded() {
        let mut a: Vec<u32> = (0..1000).collect();
        let mut b = a.clone();
        Xoshiro256::seed_from(5).shuffle(&mut a);
        Xoshiro256::seed_from(5).shuffle(&mut b);
        assert_eq!(a, b);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        let mut c: Vec<u32> = (0..1000).collect();
        Xoshiro256::seed_from(6).shuffle(&mut c);
        assert_ne!(a, c);
    }

    /// Pins the compile order of format version 2 (docs/FORMAT.md §8.1 test vectors).
    #[test]
    fn position_hash_matches_the_specification() {
        assert_eq!(position_hash(0, 0), 1448097806653121754);
        assert_eq!(position_hash(1, 0), 13896895153406867052);
        assert_eq!(position_hash(-1, 42), 14239214843730294295);
    }

    #[test]
    fn split_unit_fraction_is_close_to_requested() {
        let n = 100_000;
        let val = (0..n).filter(|&k| split_unit(k, 0) < 0.1).count();
        assert!((9_500..10_500).contains(&val), "{val}");
        let other = (0..n).filter(|&k| split_unit(k, 1) < 0.1).count();
        assert_ne!(val, other);
    }
}
