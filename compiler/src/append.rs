//! `dsc append`: new contexts compiled with a cache's recorded spec and its fitted parameters
//! frozen, written as new shards, and committed as the cache's next generation. No file of
//! the cache changes; readers of earlier generations keep reading exactly them.

use crate::commit::{CompileOptions, CompileReport};
use crate::error::Result;
use crate::lineage::Base;
use crate::own::Own;
use crate::write::OutputLock;
use dsc_format::spec::JoinSpec;
use dsc_format::spelling::OptionError;
use dsc_format::{Manifest, Stats};
use std::path::Path;

/// The inputs of an append: what a compile takes as rows, context table and joins. Everything
/// else is the cache's recorded spec.
#[derive(Debug, Clone, Default)]
pub struct AppendInputs {
    /// Rows files: paths, folders or globs (as `dsc compile` takes them).
    pub rows: Vec<String>,
    /// The new contexts' rows of the context table, when the cache was compiled with one.
    pub context: Option<String>,
    /// Lookup tables; the cache's own when `None`.
    pub joins: Option<Vec<JoinSpec>>,
}

/// Appends `new` to the cache at `cache` as its next generation (`opts.out` is ignored: the
/// generation is written inside the cache). Waits while another writer holds the cache, then
/// appends on top of the last generation. Refused, with nothing changed: a key the cache
/// already holds, inputs whose tensors would differ from the cache's, and a cache this build
/// cannot append to (a table of records, a profile's, one in object storage).
pub fn append(cache: &Path, new: &AppendInputs, opts: &CompileOptions) -> Result<CompileReport> {
    let result = run(cache, new, opts);
    opts.progress.finish();
    result
}

fn run(cache: &Path, new: &AppendInputs, opts: &CompileOptions) -> Result<CompileReport> {
    if crate::remote::is_url(cache) {
        return Err(refuse("cache", "appending to a cache in object storage is not supported yet: append to a local copy and upload it (`dsc compress --out URL`)".into()));
    }
    let lock = OutputLock::wait(cache, |_| {})?;
    let parent = Manifest::read(cache)?;
    let parent_stats = Stats::read(cache, &parent)?;
    let recorded = parent.spec();
    if parent.is_records() {
        return Err(refuse(
            "rows",
            "a table of records is keyed by row numbers, which an append would repeat".into(),
        ));
    }
    if recorded.profile.is_some() {
        return Err(refuse(
            "profile",
            "a profile's cache cannot be appended to".into(),
        ));
    }
    let mut spec = recorded.clone();
    spec.rows = new.rows.clone();
    match (&recorded.context, &new.context) {
        (Some(c), None) => {
            return Err(refuse(
                "context",
                format!(
                "the cache was compiled with a context table ({c}): give the new contexts' table"
            ),
            ))
        }
        (None, Some(_)) => {
            return Err(refuse(
                "context",
                "the cache was compiled without a context table".into(),
            ))
        }
        _ => spec.context = new.context.clone(),
    }
    if let Some(joins) = &new.joins {
        let on = |j: &[JoinSpec]| j.iter().map(|j| j.on.clone()).collect::<Vec<_>>();
        if on(joins) != on(&recorded.joins) {
            return Err(refuse(
                "joins",
                format!(
                    "the cache joins on {:?}, the append on {:?}",
                    on(&recorded.joins),
                    on(joins)
                ),
            ));
        }
        spec.joins = joins.clone();
    }
    // A context table that grows holds the earlier generations' contexts too: its keys
    // without new rows are not contexts of this append (new ones without rows are left out
    // as well, and the key check refuses any the cache has).
    if spec.empty_contexts == dsc_format::spec::EmptyContexts::Error {
        spec.empty_contexts = dsc_format::spec::EmptyContexts::Drop;
    }
    spec.fit_from = Some(cache.display().to_string());
    let base = Base {
        cache: cache.into(),
        parent,
        parent_stats,
        lock: Some(lock),
    };
    let recipe = Own::new(&spec)?.append_to(base);
    crate::local::run(recipe, opts)
}

fn refuse(key: &'static str, problem: String) -> crate::CompileError {
    OptionError::new(key, problem).into()
}
