//! The engine's digit split (`split_sub_columns_digit`), computed from the bits of the f64.
//!
//! The engine formats `|x|` with `np.format_float_positional(unique=True, pad_left=50,
//! pad_right=20, precision=20)` and cuts characters out of the string. What that string holds is:
//! the shortest round-trip decimal of `|x|`, or, where that has more than 20 fractional digits,
//! `|x|` rounded exactly to 20 places (ties to even). Positions `E18..E0` are the integer digits
//! of `|x| mod 10^19`; for `|x| >= 1e50` the engine's 50-character pad overflows and its window
//! slides, but a double's shortest form has at most 17 significant digits, so the window then
//! holds zeros only, which is also what `|x| mod 10^19` of the shortest form gives for every
//! `|x| >= 1e36`. So one rule covers every finite input.
//!
//! Here the decimal is found without strings for the common cases (integers below 2^53, and
//! values with up to 20 fractional digits whose shortest form fits 53 bits, by Clinger's exact
//! fast-path test), and the 20-place rounding is exact integer arithmetic on the mantissa. Only
//! values outside both (17-digit fractions, integers above 2^53) take the standard library's
//! shortest formatter into a stack buffer.

/// Highest digit position the engine keeps.
pub const MAX_DECIMAL: i32 = 18;
/// Lowest digit position the formatter can produce.
pub const MIN_DECIMAL: i32 = -20;
/// Fractional places of the engine's formatter.
pub const MAX_SCALE: u32 = 20;

const POW10: [u64; 20] = {
    let mut t = [1u64; 20];
    let mut i = 1;
    while i < 20 {
        t[i] = t[i - 1] * 10;
        i += 1;
    }
    t
};

const POW10_F64: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

const TWO_53: f64 = 9_007_199_254_740_992.0;

/// The digits of one value: `E18..E0` as an integer below 10^19, `E-1..E-10` and `E-11..E-20`
/// as 10-digit integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Digits {
    /// The engine's `nan` sub-column.
    pub nan: bool,
    /// The engine's `neg` sub-column (`-0.0` and NaN are not negative).
    pub neg: bool,
    int19: u64,
    frac_hi: u64,
    frac_lo: u64,
    /// Fractional digits of the shortest round-trip form (uncapped; 0 for NaN): the engine's
    /// per-partition digit window reaches down to `-min(this, 20)`.
    pub scale: u32,
}

impl Digits {
    /// The digit at position `E{d}`, `-20 <= d <= 18`.
    #[inline]
    pub fn at(&self, d: i32) -> u8 {
        debug_assert!((MIN_DECIMAL..=MAX_DECIMAL).contains(&d));
        let v = if d >= 0 {
            self.int19 / POW10[d as usize]
        } else if d >= -10 {
            self.frac_hi / POW10[(d + 10) as usize]
        } else {
            self.frac_lo / POW10[(d + 20) as usize]
        };
        (v % 10) as u8
    }

    /// All 39 digits, `E18` first and `E-20` last: the bulk form of [`Digits::at`] (division by
    /// the constant 10 only, which compiles to multiplications).
    pub fn write_all(&self, out: &mut [u8; 39]) {
        let spread = |mut v: u64, slots: &mut [u8]| {
            for slot in slots.iter_mut().rev() {
                *slot = (v % 10) as u8;
                v /= 10;
            }
        };
        let (int, frac) = out.split_at_mut(19);
        let (hi, lo) = frac.split_at_mut(10);
        spread(self.int19, int);
        spread(self.frac_hi, hi);
        spread(self.frac_lo, lo);
    }
}

/// Splits one value as the engine does (`values.astype("float64")` first: integers go through
/// f64 with ties to even, as Rust's `as` does).
pub fn split(x: f64) -> Digits {
    if x.is_nan() {
        return Digits {
            nan: true,
            ..Digits::default()
        };
    }
    debug_assert!(x.is_finite(), "infinities are rejected before the split");
    let neg = x < 0.0;
    let a = x.abs();
    let mut d = if a == 0.0 {
        Digits::default()
    } else if a < TWO_53 && a.fract() == 0.0 {
        // The shortest form of an integer below 2^53 is the integer: any shorter decimal
        // differs by at least 1, outside the rounding interval of half an ulp <= 0.5.
        Digits {
            int19: a as u64,
            ..Digits::default()
        }
    } else if let Some(d) = fixed_point(a) {
        d
    } else {
        slow_shortest(a)
    };
    d.neg = neg;
    d
}

/// Places `n * 10^-k` (with `k` fractional digits, `k <= 20`) into digit positions.
fn from_scaled(n: u64, k: u32) -> Digits {
    debug_assert!(k <= MAX_SCALE);
    let (int, frac) = if k == 0 {
        (n, 0u128)
    } else if k < 20 {
        let p = POW10[k as usize];
        (
            n / p,
            u128::from(n % p) * u128::from(POW10[(20 - k) as usize]),
        )
    } else {
        (0, u128::from(n))
    };
    Digits {
        int19: int % (POW10[19 - 1] * 10),
        frac_hi: (frac / 10_000_000_000) as u64,
        frac_lo: (frac % 10_000_000_000) as u64,
        scale: k,
        ..Digits::default()
    }
}

/// The shortest form when it has `k <= 20` fractional digits and `n < 2^53` significant value:
/// the first `k` for which exactly one of the integers next to `a * 10^k` parses back to `a`.
/// `n / 10^k` with `n < 2^53` and `k <= 22` is one correctly rounded division of exact operands,
/// so the test is exact. `None` when no `k` qualifies or two candidates do (left to the exact
/// formatter, which picks the closer).
fn fixed_point(a: f64) -> Option<Digits> {
    // A decimal that round-trips with k places also does with any more places (same value), so
    // if the most places that fit 53 bits fail, every smaller k fails: check that first, which
    // sends full-precision values to the exact formatter after one test instead of twenty.
    let k_max = (1..=MAX_SCALE)
        .take_while(|&k| a * POW10_F64[k as usize] < TWO_53 - 2.0)
        .last()?;
    if candidate(a, k_max) == Candidate::None {
        return None;
    }
    // The first significant digit bounds the search from below.
    let k_min = (1..=k_max)
        .find(|&k| a * POW10_F64[k as usize] >= 0.5)
        .unwrap_or(k_max);
    for k in k_min..=k_max {
        match candidate(a, k) {
            Candidate::None => continue,
            Candidate::One(c) => return Some(from_scaled(c, k)),
            // Two decimals of this length parse back to `a`: the closer one is wanted.
            Candidate::Many => return None,
        }
    }
    None
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Candidate {
    None,
    One(u64),
    Many,
}

/// The integers `c` next to `a * 10^k` with `c / 10^k == a`.
#[inline]
fn candidate(a: f64, k: u32) -> Candidate {
    let p = POW10_F64[k as usize];
    let n = (a * p).round() as u64;
    let mut found = Candidate::None;
    for c in [n.saturating_sub(1), n, n + 1] {
        if (c as f64) / p == a {
            found = match found {
                Candidate::None => Candidate::One(c),
                Candidate::One(f) if f == c => found,
                _ => return Candidate::Many,
            };
        }
    }
    found
}

/// A fixed buffer for the standard library's shortest formatter (no allocation).
struct StackBuf {
    buf: [u8; 40],
    len: usize,
}

impl std::fmt::Write for StackBuf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        if end > self.buf.len() {
            return Err(std::fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Shortest significant digits and decimal exponent of `a > 0`: `a ~ 0.d1d2...dn * 10^(exp+1)`,
/// i.e. the first digit sits at position `exp`.
fn shortest(a: f64) -> (u64, u32, i32) {
    use std::fmt::Write;
    let mut b = StackBuf {
        buf: [0; 40],
        len: 0,
    };
    write!(b, "{a:e}").expect("an f64 in exponent form fits 40 bytes");
    let s = &b.buf[..b.len];
    let e_at = s
        .iter()
        .position(|&c| c == b'e')
        .expect("exponent form has an e");
    let mut mant = 0u64;
    let mut ndigits = 0u32;
    for &c in &s[..e_at] {
        if c.is_ascii_digit() {
            mant = mant * 10 + u64::from(c - b'0');
            ndigits += 1;
        }
    }
    let exp_text = std::str::from_utf8(&s[e_at + 1..]).expect("ascii");
    let exp: i32 = exp_text.parse().expect("exponent is an integer");
    (mant, ndigits, exp)
}

/// Python's (and numpy's) shortest round-trip digits of a finite `a >= 0`: `(mantissa, digits,
/// exponent of the first digit)`. Where two equally short candidates both parse back to `a`, the
/// standard library may pick the upper one; Python picks the correctly rounded (even) one, and so
/// does this. Two candidates can only both parse back when 10^last <= ulp(a), i.e. with 16 or
/// more significant digits; shorter forms skip the exact check.
pub(crate) fn python_shortest(a: f64) -> (u64, u32, i32) {
    let (mant, ndigits, exp) = shortest(a);
    if ndigits < 16 {
        return (mant, ndigits, exp);
    }
    let last = exp - (ndigits as i32 - 1);
    match round_at(a, last) {
        Some(c)
            if c != u128::from(mant)
                && c < 10u128.pow(ndigits)
                && format!("{c}e{last}").parse::<f64>() == Ok(a) =>
        {
            (c as u64, ndigits, exp)
        }
        _ => (mant, ndigits, exp),
    }
}

/// `a` divided by `10^last` and rounded to an integer, ties to even, exactly; `None` when the
/// operands do not fit u128 (only for `last > 18`, where no kept digit depends on it).
fn round_at(a: f64, last: i32) -> Option<u128> {
    let (m, e) = decompose(a);
    let m = u128::from(m);
    let div_round = |num: u128, den: u128| -> u128 {
        let (q, r) = (num / den, num % den);
        let twice = r.saturating_mul(2);
        if twice > den || (twice == den && q & 1 == 1) {
            q + 1
        } else {
            q
        }
    };
    if last < 0 {
        // a * 10^k = m * 10^k * 2^e with k <= 20: m * 10^k < 2^120.
        let num = m.checked_mul(10u128.checked_pow((-last) as u32)?)?;
        if e >= 0 {
            num.checked_mul(1u128.checked_shl(e as u32)?)
        } else if -e >= 128 {
            Some(0)
        } else {
            Some(shift_round(num, (-e) as u32))
        }
    } else if last <= MAX_DECIMAL {
        let den = 10u128.pow(last as u32);
        if e >= 0 {
            let num = m.checked_mul(1u128.checked_shl(e as u32)?)?;
            Some(div_round(num, den))
        } else {
            Some(div_round(m, den.checked_mul(1u128 << (-e).min(127))?))
        }
    } else {
        None
    }
}

/// `num / 2^r` rounded to an integer, ties to even (`0 < r < 128`).
#[inline]
fn shift_round(num: u128, r: u32) -> u128 {
    let q = num >> r;
    let rem = num & ((1u128 << r) - 1);
    let half = 1u128 << (r - 1);
    if rem > half || (rem == half && q & 1 == 1) {
        q + 1
    } else {
        q
    }
}

/// The general case: the standard library's shortest digits, or exact 20-place rounding.
fn slow_shortest(a: f64) -> Digits {
    let (mant, ndigits, exp) = python_shortest(a);
    // Position of the last significant digit.
    let last = exp - (ndigits as i32 - 1);
    let scale = (-last).max(0) as u32;
    if scale > MAX_SCALE {
        let mut d = rounded_20(a);
        d.scale = scale;
        return d;
    }
    // Spread the significant digits over positions exp..last, keeping E18..E-20.
    let mut d = Digits {
        scale,
        ..Digits::default()
    };
    let mut m = mant;
    let mut pos = last;
    while m > 0 {
        let digit = m % 10;
        m /= 10;
        if (0..=MAX_DECIMAL).contains(&pos) {
            d.int19 += digit * POW10[pos as usize];
        } else if (-10..0).contains(&pos) {
            d.frac_hi += digit * POW10[(pos + 10) as usize];
        } else if (MIN_DECIMAL..-10).contains(&pos) {
            d.frac_lo += digit * POW10[(pos + 20) as usize];
        }
        pos += 1;
    }
    d
}

/// `a = m * 2^e` exactly, for finite `a >= 0`.
fn decompose(a: f64) -> (u64, i32) {
    let bits = a.to_bits();
    let exp_field = ((bits >> 52) & 0x7ff) as i32;
    let frac = bits & ((1u64 << 52) - 1);
    if exp_field == 0 {
        (frac, -1074)
    } else {
        (frac | (1u64 << 52), exp_field - 1075)
    }
}

/// `a` rounded exactly to 20 fractional places, ties to even: `a = m * 2^e`, so
/// `a * 10^20 = m * 5^20 * 2^(e + 20)`, which fits u128 before the shift.
fn rounded_20(a: f64) -> Digits {
    let (m, e) = decompose(a);
    let big = u128::from(m) * 95_367_431_640_625u128; // 5^20
    let shift = e + 20;
    let n: u128 = if shift >= 0 {
        big << shift
    } else {
        let r = (-shift) as u32;
        if r >= 128 {
            0
        } else {
            shift_round(big, r)
        }
    };
    // Only reached when the shortest form has more than 20 fractional digits, so a < 1e-3.
    debug_assert!(n < 10u128.pow(20));
    from_scaled(n as u64, 20)
}

/// Fractional digits of the shortest round-trip form of `x` (what the engine measures with
/// `np.format_float_positional(v, unique=True, trim="-")`), 0 for NaN.
pub fn shortest_scale(x: f64) -> u32 {
    split(x).scale
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(x: f64) -> String {
        let d = split(x);
        (MIN_DECIMAL..=MAX_DECIMAL)
            .rev()
            .map(|p| char::from(b'0' + d.at(p)))
            .collect()
    }

    #[test]
    fn simple_values() {
        assert_eq!(&window(123.45)[16..23], "1234500");
        assert_eq!(window(0.1).find('1'), Some(19));
        assert!(!split(-0.0).neg && split(-1.5).neg);
        assert_eq!(
            split(f64::NAN),
            Digits {
                nan: true,
                ..Digits::default()
            }
        );
        // 1e19 keeps nothing above E18.
        assert_eq!(window(1e19), "0".repeat(39));
        assert_eq!(shortest_scale(0.125), 3);
        assert_eq!(shortest_scale(1e-25), 25);
    }

    #[test]
    fn fast_and_slow_paths_agree() {
        let mut state = 0x1234_5678_9abc_def0u64;
        for _ in 0..20_000 {
            state = dsc_format::rng::mix64(state);
            // Half random bit patterns, half short decimals (the fast path's domain).
            let x = if state & 1 == 0 {
                f64::from_bits(state >> 2) % 1e6
            } else {
                (state >> 20) as f64 / 10f64.powi((state % 13) as i32)
            };
            if !x.is_finite() || x == 0.0 {
                continue;
            }
            let fast = split(x);
            let slow = {
                let mut d = slow_shortest(x.abs());
                d.neg = x < 0.0;
                d
            };
            assert_eq!(fast, slow, "{x:e}");
        }
    }
}
