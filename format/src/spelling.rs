//! How an error names an option. The libraries name every option by its key, as a spec file or
//! a Rust struct spells it, in backticks: `` `max_len` ``, or with a value, `` `nan=zero` ``.
//! Each front end spells those its own way before a person reads the message: the command line
//! as `--max-len` and `--nan zero` (a switch `` `x=false` `` as `--no-x`), Python as `max_len=`
//! and `nan="zero"`. A library never names
//! a flag, so a Python caller is never told about `--max-len`.
//!
//! ```
//! use dsc_format::spelling::{spell, Spelling};
//!
//! let message = "`max_len` must be at least 1; or pass `truncate=tail`";
//! assert_eq!(
//!     spell(message, Spelling::Cli),
//!     "--max-len must be at least 1; or pass --truncate tail"
//! );
//! assert_eq!(
//!     spell(message, Spelling::Python),
//!     "max_len= must be at least 1; or pass truncate=\"tail\""
//! );
//! assert_eq!(spell(message, Spelling::Spec), message);
//! ```

/// An option that cannot be used as given: its key (as a spec file, `LoaderOptions` or a run
/// configuration spells it) and what is wrong with it; the problem names other options as
/// `` `key` `` too. Front ends find the option by its key (Python's `OptionsError.option`) and
/// spell the message with [`spell`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{key}{}` {problem}", value.as_ref().map_or_else(String::new, |v| format!("={v}")))]
pub struct OptionError {
    /// The option, as a spec file spells it (`max_len`, `val_fraction`).
    pub key: &'static str,
    /// The value given, where the message shows it (`batch_size=0`): spelled with the key.
    pub value: Option<String>,
    /// What is wrong, continuing a sentence that starts with the option: "must be at least 1".
    pub problem: String,
}

impl OptionError {
    /// The option `key` and what is wrong with it.
    pub fn new(key: &'static str, problem: impl Into<String>) -> OptionError {
        OptionError {
            key,
            value: None,
            problem: problem.into(),
        }
    }

    /// The option `key`, the value it was given and what is wrong with it: each front end
    /// spells the pair its own way (`--batch-size 0`, `batch_size=0`).
    pub fn given(
        key: &'static str,
        value: impl std::fmt::Display,
        problem: impl Into<String>,
    ) -> OptionError {
        OptionError {
            key,
            value: Some(value.to_string()),
            problem: problem.into(),
        }
    }
}

/// The keys of a struct serialised as a JSON object, with their values: what a spec file or a
/// keyword call gives, to lay over, compare or check key by key.
pub fn fields<T: serde::Serialize>(value: &T) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => unreachable!("a struct of options serialises to an object"),
    }
}

/// Checks each key of `given` alone over `defaults` (a whole object of `T` as JSON): the first
/// key not among `keys`, or whose value `T` cannot hold, is an [`OptionError`] naming it (as
/// `what` names the object for an unknown key), with the value. Checking keys one by one is
/// what lets a front end that passes values through (Python's keywords, a command line's
/// flags) be told which one is at fault, where serde names only a position in the text.
pub fn check_each_key<T: serde::de::DeserializeOwned>(
    defaults: &serde_json::Map<String, serde_json::Value>,
    given: &serde_json::Map<String, serde_json::Value>,
    keys: &[&'static str],
    what: &'static str,
) -> Result<(), OptionError> {
    for (name, value) in given {
        let Some(&key) = keys.iter().find(|k| **k == name) else {
            return Err(OptionError::new(
                what,
                format!("has no key {name:?}: it takes {}", keys.join(", ")),
            ));
        };
        let mut alone = defaults.clone();
        alone.insert(name.clone(), value.clone());
        if let Err(e) = serde_json::from_value::<T>(serde_json::Value::Object(alone)) {
            let shown = match value {
                serde_json::Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            // serde quotes values in backticks, which a message keeps for option keys.
            return Err(OptionError::given(
                key,
                shown,
                e.to_string().replace('`', "\""),
            ));
        }
    }
    Ok(())
}

/// Who reads the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spelling {
    /// A spec file or a Rust caller: keys stay as they are, in backticks.
    Spec,
    /// The command line: `--key-with-dashes` and `--key value`.
    Cli,
    /// Python keyword arguments: `key=` and `key="value"`.
    Python,
}

/// Keys whose command-line flag is not the key with dashes. The loader's `threads` is
/// `--loader-threads` on every command line (`dsc bench`, examples/train.py), where a bare
/// `--threads` is the tool's own (dsc's workers, the trainers' torch threads).
const CLI_FLAGS: &[(&str, &str)] = &[("joins", "join"), ("threads", "loader-threads")];
/// Spec keys the command line takes as positional arguments, with the name its help shows.
const CLI_POSITIONAL: &[(&str, &str)] = &[("rows", "ROWS")];

/// `text` with every `` `key` `` and `` `key=value` `` (a key is lowercase letters, digits and
/// underscores, starting with a letter) spelled for `how`; anything else in backticks (a
/// command, a path) is left as it is.
pub fn spell(text: &str, how: Spelling) -> String {
    if how == Spelling::Spec {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('`') {
        let Some(len) = rest[open + 1..].find('`') else {
            break;
        };
        let inner = &rest[open + 1..open + 1 + len];
        out.push_str(&rest[..open]);
        match option(inner) {
            Some((key, value)) => out.push_str(&spelled(key, value, how)),
            None => out.push_str(&rest[open..open + len + 2]),
        }
        rest = &rest[open + len + 2..];
    }
    out.push_str(rest);
    out
}

/// `key` or `key=value` where `key` is an identifier, else `None`.
fn option(inner: &str) -> Option<(&str, Option<&str>)> {
    let (key, value) = match inner.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (inner, None),
    };
    let mut chars = key.chars();
    let starts = chars.next().is_some_and(|c| c.is_ascii_lowercase());
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    (starts && rest_ok && value.is_none_or(|v| !v.contains('`'))).then_some((key, value))
}

fn spelled(key: &str, value: Option<&str>, how: Spelling) -> String {
    match how {
        Spelling::Spec => unreachable!("`spell` leaves a spec-file spelling as it is"),
        Spelling::Cli => {
            if let Some((_, name)) = CLI_POSITIONAL.iter().find(|(k, _)| *k == key) {
                return match value {
                    Some(v) => format!("{name} {v}"),
                    None => name.to_string(),
                };
            }
            let flag = CLI_FLAGS
                .iter()
                .find(|(k, _)| *k == key)
                .map_or_else(|| key.replace('_', "-"), |(_, f)| f.to_string());
            // Switches: `--flag` on, `--no-flag` off.
            match value {
                Some("true") => format!("--{flag}"),
                Some("false") => format!("--no-{flag}"),
                Some(v) => format!("--{flag} {v}"),
                None => format!("--{flag}"),
            }
        }
        Spelling::Python => match value {
            Some("true") => format!("{key}=True"),
            Some("false") => format!("{key}=False"),
            Some(v) if is_literal(v) => format!("{key}={v}"),
            Some(v) => format!("{key}={v:?}"),
            None => format!("{key}="),
        },
    }
}

/// A value Python writes without quotes: a number, `True`, `False`, `None`.
fn is_literal(v: &str) -> bool {
    v.parse::<f64>().is_ok() || matches!(v, "True" | "False" | "None")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_identifiers_in_backticks_are_options() {
        let text = "run `dsc compile …` or raise `ulimit -f`; `joins` and `shard_size=1024`";
        assert_eq!(
            spell(text, Spelling::Cli),
            "run `dsc compile …` or raise `ulimit -f`; --join and --shard-size 1024"
        );
        assert_eq!(
            spell("`rows` names no files", Spelling::Cli),
            "ROWS names no files"
        );
        assert_eq!(
            spell(text, Spelling::Python),
            "run `dsc compile …` or raise `ulimit -f`; joins= and shard_size=1024"
        );
        assert_eq!(
            spell("an `unclosed quote", Spelling::Cli),
            "an `unclosed quote"
        );
        assert_eq!(spell("`Key`", Spelling::Cli), "`Key`");
        let switch = "`normalise=false` or `bucket=true`";
        assert_eq!(spell(switch, Spelling::Cli), "--no-normalise or --bucket");
        assert_eq!(
            spell(switch, Spelling::Python),
            "normalise=False or bucket=True"
        );
    }
}
