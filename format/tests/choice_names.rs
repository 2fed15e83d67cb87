//! Every named choice has one spelling: its name parses to its value, prints back, and is the
//! spelling serde uses in spec files and manifests.

use dsc_format::choice::{Choice, ChoiceError};
use dsc_format::spec::{EmptyContexts, NanPolicy, Truncate, UnmatchedRows};
use dsc_format::Codec;

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
