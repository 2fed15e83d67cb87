//! What the profile reads of a spec, typed ([`ProfileSpec`]): its keys are the keys the
//! profile takes, and every other key a spec gives (set to other than its default) is refused
//! by its key. A new spec key is refused by the profile until this type takes it.

use crate::error::Result;
use dsc_format::spec::{CompileSpec, SPEC_KEYS};
use dsc_format::spelling::{fields, OptionError};
use serde::Serialize;

/// The keys of the split options, refused with the profile's own way of naming its validation
/// split.
const SPLIT_KEYS: [&str; 4] = ["val_fraction", "split_seed", "split_by", "split_keys"];

/// Everything a profile compile reads of its spec.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProfileSpec {
    /// Rows files (the engine's target table).
    pub rows: Vec<String>,
    /// The rows' context column.
    pub key: String,
    /// The context table.
    pub context: String,
    /// The context table's key column (`key` unless given).
    pub context_key: String,
    /// Seed of the global shuffle.
    pub seed: u64,
    /// Target shard size in bytes.
    pub shard_size: u64,
    /// Decoded input bytes per bucket.
    pub bucket_size: Option<u64>,
    /// The profile's name.
    pub profile: String,
    /// The file listing the validation keys.
    pub val_keys: Option<String>,
    /// The engine's `n_partitions`.
    pub partitions: usize,
}

impl ProfileSpec {
    /// The profile's part of `spec`, refusing a spec without what the profile needs and every
    /// key it does not take.
    pub fn of(spec: &CompileSpec) -> Result<ProfileSpec> {
        if spec.key.is_empty() {
            return Err(OptionError::new(
                "profile",
                "mostlyai compiles sequences: give `key` (the rows' context column)",
            )
            .into());
        }
        let context = spec.context.clone().ok_or_else(|| {
            OptionError::new("profile", "mostlyai needs a context table (`context`)")
        })?;
        let partitions = spec.partitions.unwrap_or(1);
        if partitions == 0 {
            return Err(OptionError::new("partitions", "must be at least 1").into());
        }
        crate::plan::check_bucket_size(spec)?;
        let taken = ProfileSpec {
            rows: spec.rows.clone(),
            key: spec.key.clone(),
            context,
            context_key: spec.context_key().to_string(),
            seed: spec.seed,
            shard_size: spec.shard_size,
            bucket_size: spec.bucket_size,
            profile: spec.profile.clone().unwrap_or_default(),
            val_keys: spec.val_keys.clone(),
            partitions,
        };
        taken.refuse_others(spec)?;
        Ok(taken)
    }

    /// Refuses the first key of `spec`, in spec order, that this type does not take and that
    /// `spec` sets to other than its default: the profile encodes every column as the engine
    /// does, so an option of dsc's own recipe would be silently ignored.
    fn refuse_others(&self, spec: &CompileSpec) -> Result<()> {
        let taken = fields(self);
        let given = fields(spec);
        let default = fields(&CompileSpec::new(spec.rows.clone(), spec.key.clone()));
        for key in SPEC_KEYS {
            if taken.contains_key(*key) || given.get(*key) == default.get(*key) {
                continue;
            }
            let advice = if SPLIT_KEYS.contains(key) {
                " (give `val_keys`)"
            } else {
                ""
            };
            return Err(OptionError::new(
                key,
                format!(
                    "does not apply to `profile=mostlyai`{advice}: the profile encodes every \
                     column of both tables as the engine does, in input order, up to the \
                     longest sequence"
                ),
            )
            .into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile_spec() -> CompileSpec {
        let mut spec = CompileSpec::new(vec!["rows.parquet".into()], "id");
        spec.profile = Some("mostlyai".into());
        spec.context = Some("ctx.parquet".into());
        spec
    }

    #[test]
    fn every_key_the_type_does_not_take_is_refused_by_its_key() {
        let mut spec = profile_spec();
        spec.val_keys = Some("val.txt".into());
        spec.partitions = Some(2);
        spec.seed = 9;
        let taken = ProfileSpec::of(&spec).unwrap();
        assert_eq!((taken.partitions, taken.context_key.as_str()), (2, "id"));
        let refused = |edit: fn(&mut CompileSpec)| {
            let mut spec = profile_spec();
            edit(&mut spec);
            match ProfileSpec::of(&spec) {
                Err(crate::error::CompileError::Spec(o)) => (o.key, o.problem),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(refused(|s| s.features = vec!["x".into()]).0, "features");
        // A key the profile never read was taken silently before its type listed the keys.
        assert_eq!(refused(|s| s.ngram_vocab = Some(8)).0, "ngram_vocab");
        let (key, problem) = refused(|s| s.val_fraction = 0.1);
        assert!(
            key == "val_fraction" && problem.contains("`val_keys`"),
            "{problem}"
        );
    }
}
