//! Which recipe a spec asks for: the one place a compile looks at `profile`. Both drivers start
//! here; each then runs the recipe it is handed through the same generic stage order.

use crate::error::Result;
use crate::mostlyai::{self, Profile};
use crate::own::Own;
use dsc_format::spec::CompileSpec;
use dsc_format::spelling::OptionError;

/// A compile's recipe, checked and with its inputs open.
pub(crate) enum Job<'s> {
    /// dsc's own compile.
    Own(Own<'s>),
    /// `--profile mostlyai`.
    Profile(Profile<'s>),
}

impl<'s> Job<'s> {
    /// The recipe `spec` names, built; an unknown profile, or the profile's options without it,
    /// refused first.
    pub fn new(spec: &'s CompileSpec) -> Result<Job<'s>> {
        match spec.profile.as_deref() {
            None if spec.val_keys.is_some() || spec.partitions.is_some() => {
                let key = if spec.val_keys.is_some() {
                    "val_keys"
                } else {
                    "partitions"
                };
                let problem = format!("only applies with `profile={}`", mostlyai::PROFILE);
                Err(OptionError::new(key, problem).into())
            }
            None => Own::new(spec).map(Job::Own),
            Some(mostlyai::PROFILE) => Profile::new(spec).map(Job::Profile),
            Some(other) => Err(OptionError::new(
                "profile",
                format!("{other:?} is unknown (known: {:?})", mostlyai::PROFILE),
            )
            .into()),
        }
    }
}
