//! Small printing helpers shared by the commands.

/// `println!` that returns the write error instead of panicking, so that a closed pipe
/// (`dsc inspect cache | head`) ends the command quietly through `main`.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*)?;
    }};
}
pub(crate) use outln;

use std::io::IsTerminal;

/// True when the error is a closed stdout (e.g. `dsc inspect | head`), which is not a failure.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    let broken = Some(std::io::ErrorKind::BrokenPipe);
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().map(|io| io.kind()) == broken
            || c.downcast_ref::<serde_json::Error>()
                .and_then(|j| j.io_error_kind())
                == broken
    })
}

/// The error and its causes on one line, skipping a cause whose text the message already
/// holds (the library errors quote their source, and anyhow would repeat it).
pub fn error_chain(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
    }
    msg
}

/// Peak resident memory of this process in MiB (Linux `VmHWM`), if known.
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes in B, KiB, MiB, GiB, ….
pub fn bytes(n: u64) -> String {
    dsc_format::spec::format_size(n)
}

/// Bold on a terminal, plain otherwise.
pub fn bold(s: &str) -> String {
    if std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none() {
        format!("\x1b[1m{s}\x1b[0m")
    } else {
        s.to_string()
    }
}

/// Prints JSON to stdout, failing on a closed pipe like any other write.
pub fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    // A write that fails is the write's error (a closed pipe is then seen as one), not a
    // serialization error wrapping it.
    serde_json::to_writer_pretty(&mut out, value).map_err(|e| match e.io_error_kind() {
        Some(kind) => anyhow::Error::new(std::io::Error::new(kind, e)),
        None => e.into(),
    })?;
    writeln!(out)?;
    Ok(())
}

/// A compact number: integers as integers, others with 4 significant digits.
pub fn num(v: f64) -> String {
    if v.is_nan() {
        return "-".into();
    }
    if v == v.trunc() && v.abs() < 1e12 {
        return format!("{}", v as i64);
    }
    let mag = v.abs();
    if mag != 0.0 && !(1e-3..1e6).contains(&mag) {
        format!("{v:.3e}")
    } else {
        let digits = (3 - mag.log10().floor() as i32).clamp(0, 6) as usize;
        format!("{v:.digits$}")
    }
}
