//! Python's spellings of numbers and timestamps, where the engine's statistics carry them as
//! strings (JSON keys of discrete codes, datetime `min`/`max`). Only used per distinct value or
//! once per partition, never per row.

/// Python's `repr(float)`: shortest round-trip digits; positional when the decimal exponent is
/// in `-4..16` (always with a fractional part, `18.0`), otherwise `d.ddde+XX` (`1e+16`, `1e-05`).
pub fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    // The same shortest digits as the digit split, ties resolved as Python does.
    let (mant, ndigits, exp) = super::digits::python_shortest(x.abs());
    let digits = format!("{mant:0width$}", width = ndigits as usize);
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let body = if exp < 0 {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        } else if n > exp + 1 {
            format!(
                "{}.{}",
                &digits[..=exp as usize],
                &digits[exp as usize + 1..]
            )
        } else {
            format!("{digits}{}.0", "0".repeat((exp + 1 - n) as usize))
        };
        format!("{sign}{body}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{esign}{:02}", exp.abs())
    }
}

/// Civil date of a day count since 1970-01-01 (proleptic Gregorian).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    // Howard Hinnant's days_from_civil inverse.
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// How pandas spells a set of timestamps with `astype(str)`: the finest resolution any of
/// them needs decides for all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TimeSpelling {
    /// All at midnight: `YYYY-MM-DD`.
    Date,
    /// `YYYY-MM-DD HH:MM:SS`.
    Seconds,
    /// `.fff`.
    Millis,
    /// `.ffffff`.
    Micros,
}

impl TimeSpelling {
    /// The resolution one value needs.
    pub fn of(us: i64) -> TimeSpelling {
        let in_day = us.rem_euclid(86_400_000_000);
        if in_day == 0 {
            TimeSpelling::Date
        } else if us.rem_euclid(1_000_000) == 0 {
            TimeSpelling::Seconds
        } else if us.rem_euclid(1_000) == 0 {
            TimeSpelling::Millis
        } else {
            TimeSpelling::Micros
        }
    }

    /// The value spelled at this resolution.
    pub fn format(self, us: i64) -> String {
        let days = us.div_euclid(86_400_000_000);
        let rest = us.rem_euclid(86_400_000_000);
        let (y, m, d) = civil_from_days(days);
        let date = format!("{y}-{m:02}-{d:02}");
        if self == TimeSpelling::Date {
            return date;
        }
        let secs = rest / 1_000_000;
        let frac = rest % 1_000_000;
        let hms = format!(
            "{date} {:02}:{:02}:{:02}",
            secs / 3600,
            secs / 60 % 60,
            secs % 60
        );
        match self {
            TimeSpelling::Seconds => hms,
            TimeSpelling::Millis => format!("{hms}.{:03}", frac / 1000),
            _ => format!("{hms}.{frac:06}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_repr() {
        for (x, s) in [
            (18.0, "18.0"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (-2.5, "-2.5"),
            (123456789012345.6, "123456789012345.6"),
            (1.5e300, "1.5e+300"),
            (0.0, "0.0"),
        ] {
            assert_eq!(float_repr(x), s);
        }
        // Exactly between two 17-digit candidates: Python keeps the even one.
        let tie: f64 = "-1578556095400108.25".parse().unwrap();
        assert_eq!(float_repr(tie), "-1578556095400108.2");
    }

    #[test]
    fn timestamps() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        let us = 1_578_183_206_000_000i64; // 2020-01-05 00:13:26
        assert_eq!(TimeSpelling::of(us), TimeSpelling::Seconds);
        assert_eq!(TimeSpelling::Millis.format(us), "2020-01-05 00:13:26.000");
        assert_eq!(TimeSpelling::Date.format(us - 806_000_000), "2020-01-05");
    }
}
