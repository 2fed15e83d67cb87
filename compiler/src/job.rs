//! Which recipe a spec asks for: the one place a compile looks at `profile`. Both drivers start
//! here; each then runs the recipe it is handed through the same generic stage order.

use crate::error::{CompileError, Result};
use crate::mostlyai::{self, Profile};
use crate::own::Own;
use dsc_format::spec::CompileSpec;

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
                Err(CompileError::Spec(format!(
                    "val_keys (--val-keys) and partitions (--partitions) only apply with the \
                     {:?} profile",
                    mostlyai::PROFILE
                )))
            }
            None => Own::new(spec).map(Job::Own),
            Some(mostlyai::PROFILE) => Profile::new(spec).map(Job::Profile),
            Some(other) => Err(CompileError::Spec(format!(
                "unknown profile {other:?} (known: {:?})",
                mostlyai::PROFILE
            ))),
        }
    }
}
