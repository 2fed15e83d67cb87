//! dsc's own recipe: plan → read and spill into buckets → per bucket: group, join contexts,
//! split, partial statistics → merge statistics, fit encodings → per bucket: group again,
//! encode, write its shards → stats.json → manifest.json. The drivers (`local`, `partition`)
//! call these steps in this order.

use crate::bucket::{BucketColumn, BucketText, ColumnId, Shared};
use crate::budget;
use crate::column::Kind;
use crate::commit::{commit_cache, CompileReport, Timer};
use crate::error::Result;
use crate::fit::{self, FitPart, Merged};
use crate::frozen::Frozen;
use crate::lineage::Base;
use crate::lookup::{self, ContextPart, ContextSide, Keyed};
use crate::phases::{Phase, Phases};
use crate::plan::{self, Source, TextSource};
use crate::read::{self, Role};
use crate::recipe::Recipe;
use crate::rules::Rules;
use crate::runs::{RunsFile, ValueRuns};
use crate::shards::{self, Layout, WritePart};
use crate::spill::{self, Buckets, Described, Spill, SpillPart, SpillTo};
use crate::split;
use crate::write::Staging;
use crate::Progress;
use dsc_format::keys::KeyType;
use dsc_format::manifest::Inputs;
use dsc_format::spec::{CompileSpec, DEFAULT_BUCKET_SIZE};
use dsc_format::{Manifest, ShardEntry};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// dsc's own compile of `spec`: the plan, the inputs' footers, the side tables (context table,
/// joins) and the buckets, read before any bucket is touched.
pub(crate) struct Own<'s> {
    spec: &'s CompileSpec,
    /// What the stages read of the spec.
    rules: Rules<'s>,
    plan: plan::Plan,
    named_inputs: Vec<(PathBuf, &'static str)>,
    /// The opened rows files, until the scan reads them.
    inputs: Option<read::Inputs>,
    /// What describes the rows files to the spill, until it is assembled.
    described: Option<Described>,
    joins: Vec<Keyed>,
    /// The context table, once spilled and read back ([`Recipe::spilled`]).
    context: Option<ContextSide>,
    buckets: Buckets,
    width: u64,
    /// The rows the spill is planned for (a list table's: its elements' upper bound).
    rows_planned: u64,
    /// The role of the context table's key: of the rows key's kind (integer or string).
    context_key: Role,
    /// Another cache's fitted parameters, taken instead of fitting (`fit_from`).
    frozen: Option<Box<Frozen>>,
    /// The generation this compile appends to, if it is an append.
    base: Option<Box<Base>>,
    /// Which rows the scan keeps, by key (a compaction's left-out rows, the contexts an
    /// append hides read back for their statistics): every row by default.
    filter: spill::KeyFilter,
    /// Where this compile's time goes.
    phases: Phases,
}

/// dsc's own spill: the rows by bucket, and the splits decided from them and the context table.
pub(crate) struct OwnSpilled<'s> {
    spill: Spill,
    splits: split::Splits<'s>,
}

/// dsc's own fitted statistics and encodings, the shard layout, and the split names.
pub(crate) struct OwnFitted {
    merged: Merged,
    layout: Layout,
    splits: Vec<String>,
}

impl<'s> Own<'s> {
    /// Plans `spec`, checks its encodings, opens every rows file's footer, sizes the buckets and
    /// reads the join tables.
    pub fn new(spec: &'s CompileSpec) -> Result<Own<'s>> {
        let plan = plan::plan(spec)?;
        for rc in &plan.row_columns {
            fit::unfitted_prefix(&rc.name, &rc.chain)?;
        }
        for cc in &plan.context_columns {
            fit::unfitted_prefix(&cc.name, &cc.chain)?;
        }
        let named_inputs = input_files(spec, &plan.rows_files);
        let phases = Phases::default();
        let opening = Instant::now();
        let mut inputs = read::open_all(&plan.rows_files, &plan.rows_wants, read::Table::Rows)?;
        // A string key that is nothing else is held as plain strings, not a dictionary.
        let key = &spec.key;
        let also_coded =
            spec.categorical.contains(key) || plan.text_columns.iter().any(|t| t.name == *key);
        read::plain_key(&mut inputs.types, !also_coded);
        let context_key = Role::ContextKey {
            text: inputs.types[0].kind == Kind::Str,
        };
        let width = spill::row_width(&inputs.types);
        let size = |rows: u64| {
            Buckets::for_size(
                rows * width,
                spec.bucket_size.unwrap_or(DEFAULT_BUCKET_SIZE),
                spec.seed,
            )
        };
        // A list table is sized by its elements, the rows it is read as: those of the exploded
        // table, whose compile it equals byte for byte.
        let (buckets, rows_planned) = match inputs.types.iter().position(|t| t.list) {
            Some(i) => crate::lists::sized_buckets(
                &inputs.opened,
                &plan.rows_files,
                &plan.rows_wants[i],
                size,
            )?,
            None => {
                let rows = *inputs.offsets.last().unwrap_or(&0);
                (size(rows), rows)
            }
        };
        let described = Described {
            files: inputs.opened.iter().map(|o| o.path.clone()).collect(),
            offsets: inputs.offsets.clone(),
            types: inputs.types.clone(),
        };
        let joins = plan
            .joins
            .iter()
            .map(|(path, on, wants)| lookup::read_keyed(path, on, Role::JoinOn, wants))
            .collect::<Vec<Result<_>>>()
            .into_iter()
            .collect::<Result<_>>()?;
        phases.add(Phase::Footers, opening.elapsed());
        let frozen = spec
            .fit_from
            .as_deref()
            .map(|dir| Frozen::read(Path::new(dir)).map(Box::new))
            .transpose()?;
        Ok(Own {
            frozen,
            base: None,
            filter: Default::default(),
            spec,
            rules: Rules::of(spec),
            named_inputs,
            inputs: Some(inputs),
            described: Some(described),
            joins,
            context: None,
            buckets,
            width,
            rows_planned,
            context_key,
            plan,
            phases,
        })
    }

    /// This compile as an append to `base`: its shards continue the parent's splits and it
    /// commits the next generation.
    pub fn append_to(mut self, base: Base) -> Own<'s> {
        self.filter.skip = base.skip.clone();
        self.base = Some(Box::new(base));
        self
    }

    /// This compile of the rows of keys `keep` alone.
    pub fn keeping(mut self, keep: std::collections::HashSet<i64>) -> Own<'s> {
        self.filter.keep = Some(keep);
        self
    }

    /// This compile without the rows `skip` names per file (a compaction's, read again).
    pub fn skipping(&mut self, skip: spill::SkipKeys) {
        self.filter.skip = skip;
    }

    /// What each bucket shares, over the spilled rows.
    fn shared<'a>(&'a self, spilled: &'a OwnSpilled<'s>) -> Shared<'a> {
        Shared {
            rules: self.rules,
            spill: &spilled.spill,
            context: self.context.as_ref(),
            splits: &spilled.splits,
            columns: self
                .plan
                .row_columns
                .iter()
                .map(|rc| BucketColumn {
                    name: &rc.name,
                    join: match rc.source {
                        Source::Rows => None,
                        Source::Join(j) => Some(&self.joins[j]),
                    },
                    categorical: rc.categorical,
                    chain: &rc.chain,
                })
                .collect(),
            context_columns: self
                .plan
                .context_columns
                .iter()
                .map(|c| (c.name.as_str(), c.target, &c.chain[..]))
                .collect(),
            texts: self
                .plan
                .text_columns
                .iter()
                .map(|t| BucketText {
                    name: &t.name,
                    join: match t.source {
                        TextSource::Join(j) => Some(&self.joins[j]),
                        TextSource::Rows | TextSource::Context => None,
                    },
                    context: t.source == TextSource::Context,
                    encoding: t.encoding,
                })
                .collect(),
            phases: &self.phases,
        }
    }

    /// Whether the context table's key, if a string, is held as plain strings: unless it is
    /// also one of its string columns encoded to a fixed width.
    fn plain_context_key(&self) -> bool {
        !self
            .context_texts()
            .iter()
            .any(|t| t == self.spec.context_key())
    }

    /// The context table's string columns encoded to a fixed width.
    fn context_texts(&self) -> Vec<String> {
        self.plan
            .text_columns
            .iter()
            .filter(|t| t.source == TextSource::Context)
            .map(|t| t.name.clone())
            .collect()
    }

    /// The key column, as the manifest describes it.
    fn key_id(&self, spill: &Spill) -> ColumnId {
        let info = spill.type_of(&self.spec.key);
        ColumnId {
            // A table of records' key is each row's number across the rows files.
            name: if self.plan.records {
                "row".into()
            } else {
                self.spec.key.clone()
            },
            table: "rows",
            source_type: info.name.clone(),
            kind: info.kind,
        }
    }
}

impl<'s> Recipe for Own<'s> {
    type Spilled = OwnSpilled<'s>;
    type FitPart = FitPart;
    type Fitted = OwnFitted;

    fn staging(&mut self, out: &Path, force: bool) -> Result<Staging> {
        match &mut self.base {
            None => Staging::create(out, force),
            Some(base) => {
                let lock = base.lock.take().expect("an append stages once");
                Staging::generation(&base.cache, base.parent.generation_number() + 1, lock)
            }
        }
    }

    fn inputs(&self) -> &[(PathBuf, &'static str)] {
        &self.named_inputs
    }

    fn rows_files(&self) -> usize {
        self.plan.rows_files.len()
    }

    fn files_to_read(&self) -> usize {
        self.rows_files()
    }

    fn buckets(&self) -> Buckets {
        self.buckets
    }

    fn has_context(&self) -> bool {
        self.plan.context_files.is_some()
    }

    fn decoded_bytes(&self) -> u64 {
        self.rows_planned * self.width
    }

    fn scan(
        &mut self,
        files: Range<usize>,
        to: SpillTo,
        progress: &dyn Progress,
    ) -> Result<SpillPart> {
        let inputs = self.inputs.take().expect("a recipe is scanned once");
        spill::spill_rows(
            inputs,
            files,
            &self.plan.rows_wants,
            to,
            &self.filter,
            progress,
            &self.phases,
        )
    }

    fn scan_context(&mut self, to: SpillTo, _: &dyn Progress) -> Result<Option<ContextPart>> {
        let Some(files) = &self.plan.context_files else {
            return Ok(None);
        };
        lookup::spill_context(
            (files, self.plain_context_key()),
            &lookup::context_wants(&self.rules.context, &self.context_texts(), self.context_key),
            self.spec.split_by.as_deref(),
            to.buckets,
            to.budget,
            (to.dir, to.name),
            &self.phases,
        )
        .map(Some)
    }

    fn spilled(
        &mut self,
        dir: &Path,
        rows: Vec<SpillPart>,
        context: Option<ContextPart>,
    ) -> Result<OwnSpilled<'s>> {
        if let (Some(files), Some(part)) = (&self.plan.context_files, context) {
            self.context = Some(ContextSide::new(
                (files, self.spec.context.is_none(), self.plain_context_key()),
                self.spec.context_key(),
                lookup::context_wants(&self.rules.context, &self.context_texts(), self.context_key),
                part,
                self.buckets,
                dir,
            )?);
        }
        let described = self.described.take().expect("a recipe is spilled once");
        let spill = Spill::from_parts(
            dir,
            rows,
            self.buckets,
            described,
            self.plan.rows_wants.clone(),
        );
        let key_type = KeyType::of_source_type(&spill.type_of(&self.spec.key).name);
        let splits = split::plan(&self.rules.splits, key_type, self.context.as_ref())?;
        Ok(OwnSpilled { spill, splits })
    }

    fn at_once(&self, spilled: &OwnSpilled<'s>, budget: u64) -> Result<usize> {
        let largest = (0..self.buckets.count())
            .map(|b| spilled.spill.rows(b))
            .max()
            .unwrap_or(0);
        budget::at_once(largest, largest * self.width, budget)
    }

    fn fit(
        &self,
        spilled: &OwnSpilled<'s>,
        buckets: Range<usize>,
        at_once: usize,
        runs: &ValueRuns,
        progress: &dyn Progress,
    ) -> Result<FitPart> {
        fit::fit_buckets(&self.shared(spilled), buckets, at_once, runs, progress)
    }

    fn reduce(
        &self,
        spilled: &OwnSpilled<'s>,
        fits: Vec<FitPart>,
        values: &[RunsFile],
    ) -> Result<OwnFitted> {
        let rows_read = (0..self.buckets.count())
            .map(|b| spilled.spill.rows(b))
            .sum();
        // The statistics merged over the buckets (rank queries, fitting), counted with them: in
        // one process and in each writer of a partitioned compile alike.
        let merged = self.phases.time(Phase::Statistics, || {
            let shared = self.shared(spilled);
            fit::merge(&shared, &fits, values, rows_read, self.frozen.as_deref())
        })?;
        let targets: Vec<bool> = self.plan.row_columns.iter().map(|c| c.target).collect();
        let mut layout = Layout::new(
            &self.key_id(&spilled.spill),
            &merged,
            self.plan.records.then_some(&targets[..]),
            self.spec.shard_size,
        );
        if let Some(f) = &self.frozen {
            f.check_tensors(&layout.tensors)?;
        }
        if let Some(base) = self.base.as_ref().filter(|b| !b.compact) {
            let after: Vec<(usize, usize)> = spilled
                .splits
                .names
                .iter()
                .map(|name| {
                    base.parent
                        .split(name)
                        // Positions count every stored context, hidden ones too.
                        .map_or((0, 0), |s| (s.shards, s.contexts + s.removed))
                })
                .collect();
            layout.numbering.continue_after(&after);
        }
        Ok(OwnFitted {
            merged,
            layout,
            splits: spilled.splits.names.clone(),
        })
    }

    fn phases(&self) -> &Phases {
        &self.phases
    }

    fn write(
        &self,
        spilled: &OwnSpilled<'s>,
        fitted: &OwnFitted,
        _: &[RunsFile],
        buckets: Range<usize>,
        at_once: usize,
        dir: &Path,
        progress: &dyn Progress,
    ) -> Result<WritePart> {
        shards::write_buckets(
            &self.shared(spilled),
            &fitted.merged,
            &fitted.layout,
            buckets,
            at_once,
            dir,
            progress,
        )
    }

    fn finish(
        &self,
        fitted: OwnFitted,
        written: Vec<WritePart>,
        inputs: Inputs,
        staging: Staging,
        timer: Timer,
        progress: &dyn Progress,
    ) -> Result<CompileReport> {
        let OwnFitted {
            merged,
            layout,
            splits,
        } = fitted;
        let mut summary = merged.summary.clone();
        summary.values_filled = written.iter().map(|w| w.filled).sum();
        summary.contexts_truncated = written.iter().map(|w| w.truncated).sum();
        let mut written_splits = Vec::new();
        for (s, name) in splits.iter().enumerate() {
            let rows_stored: u64 = written.iter().map(|w| w.rows_stored[s]).sum();
            summary.rows_stored += rows_stored;
            let mut mine: Vec<ShardEntry> = written
                .iter()
                .flat_map(|w| w.entries.iter().filter(|e| e.split == *name).cloned())
                .collect();
            mine.sort_by_key(|e| e.index);
            written_splits.push((name.clone(), rows_stored, mine));
        }
        if let Some(base) = &self.base {
            let frozen = self
                .frozen
                .as_ref()
                .expect("an append takes its cache's parameters");
            let added = crate::lineage::Added {
                drift: (!base.compact)
                    .then(|| crate::drift::report(frozen, &merged, &merged.stats)),
                tensors: layout.tensors,
                splits: written_splits,
                inputs,
                summary,
                parent_stats: frozen.stats().clone(),
                stats: merged.stats,
            };
            return crate::lineage::commit_append(base, staging, added, timer, progress);
        }
        let mut builder = Manifest::builder(
            env!("CARGO_PKG_VERSION"),
            merged.max_len,
            layout.tensors,
            inputs,
            resolved_spec(self.spec, merged.max_len),
        );
        for (name, rows_stored, mine) in written_splits {
            builder = builder.split(&name, rows_stored, mine);
        }
        let manifest = builder.summary(summary);
        commit_cache(staging, manifest, merged.stats, timer, progress)
    }
}

fn resolved_spec(spec: &CompileSpec, max_len: usize) -> CompileSpec {
    let mut resolved = spec.clone();
    resolved.max_len = Some(max_len);
    resolved.context_key = spec
        .context
        .as_ref()
        .map(|_| spec.context_key().to_string());
    resolved
}

/// Every file a compile of `spec` reads, with its role.
fn input_files(spec: &CompileSpec, rows_files: &[PathBuf]) -> Vec<(PathBuf, &'static str)> {
    let mut named: Vec<(PathBuf, &'static str)> =
        rows_files.iter().map(|p| (p.clone(), "rows")).collect();
    if let Some(c) = &spec.context {
        named.push((PathBuf::from(c), "context"));
    }
    for j in &spec.joins {
        named.push((PathBuf::from(&j.file), "join"));
    }
    for file in spec.split_keys.values() {
        named.push((PathBuf::from(file), "split_keys"));
    }
    named
}
