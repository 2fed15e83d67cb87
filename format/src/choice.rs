//! Named choices (`--truncate tail`, `nan="zero"`, `truncate = "tail"` in a spec file): each
//! enum spells its values once, here, and the command line, Python and the spec files read
//! and print them through [`Choice`], `FromStr` and `Display`.

/// An enum whose values have one name each.
pub trait Choice: Sized + Copy + 'static {
    /// What is chosen, for messages (`truncate`, `codec`, …).
    const WHAT: &'static str;
    /// Every value's name, in declaration order.
    const NAMES: &'static [&'static str];
    /// Every value, in the order of [`Choice::NAMES`].
    const ALL: &'static [Self];

    /// This value's name.
    fn name(self) -> &'static str;

    /// The value called `name`, or an error listing the names there are.
    fn parse_name(name: &str) -> Result<Self, ChoiceError> {
        Self::NAMES
            .iter()
            .position(|n| *n == name)
            .map(|i| Self::ALL[i])
            .ok_or_else(|| ChoiceError {
                what: Self::WHAT,
                value: name.to_string(),
                expected: Self::NAMES,
            })
    }
}

/// A name that is none of a choice's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?}: expected one of {}", expected.join(", "))]
pub struct ChoiceError {
    /// What was being chosen.
    pub what: &'static str,
    /// The name given.
    pub value: String,
    /// The names there are.
    pub expected: &'static [&'static str],
}

/// Implements [`Choice`], `FromStr` and `Display` for an enum of unit variants, each with its
/// name: `choice!(Truncate, "truncate", { Head => "head", Tail => "tail" })`.
#[macro_export]
macro_rules! choice {
    ($ty:ident, $what:literal, { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $crate::choice::Choice for $ty {
            const WHAT: &'static str = $what;
            const NAMES: &'static [&'static str] = &[$($name),+];
            const ALL: &'static [Self] = &[$($ty::$variant),+];
            fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }
        impl std::str::FromStr for $ty {
            type Err = $crate::choice::ChoiceError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                <$ty as $crate::choice::Choice>::parse_name(s)
            }
        }
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str($crate::choice::Choice::name(*self))
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{EmptyContexts, NanPolicy, Truncate, UnmatchedRows};
    use crate::Codec;

    /// Every name parses to its value and prints back, and is the spelling serde uses in
    /// spec files and manifests: one spelling per value, everywhere.
    fn round_trips<T>()
    where
        T: Choice + std::str::FromStr<Err = ChoiceError> + std::fmt::Display + PartialEq,
        T: std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
    {
        assert_eq!(T::NAMES.len(), T::ALL.len());
        for (&name, &value) in T::NAMES.iter().zip(T::ALL) {
            assert_eq!(name.parse::<T>(), Ok(value));
            assert_eq!(value.to_string(), name);
            assert_eq!(
                serde_json::to_value(value).unwrap(),
                serde_json::json!(name)
            );
            assert_eq!(
                serde_json::from_value::<T>(serde_json::json!(name)).unwrap(),
                value
            );
        }
        let err = "nonsense".parse::<T>().unwrap_err();
        assert_eq!(err.what, T::WHAT);
        assert!(err.to_string().contains(T::NAMES[0]), "{err}");
    }

    #[test]
    fn every_choice_has_one_spelling() {
        round_trips::<Truncate>();
        round_trips::<NanPolicy>();
        round_trips::<UnmatchedRows>();
        round_trips::<EmptyContexts>();
        round_trips::<Codec>();
    }
}
