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
