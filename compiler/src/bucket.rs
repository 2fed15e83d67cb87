//! One bucket of the input as the compile sees it: its rows read back from the spill, grouped
//! into contexts, matched with the context table, truncated and assigned to splits. Both passes
//! over the buckets (statistics, then shards) prepare a bucket the same way.

use crate::column::{Column, Kind};
use crate::encode::{Access, DROPPED, TRAIN};
use crate::error::{CompileError, Result};
use crate::group::{self, Group};
use crate::lookup::{ContextSide, Keyed};
use crate::phases::{Phase, Phases};
use crate::plan::{Step, TextEncoding};
use crate::read::RowsTable;
use crate::spill::Spill;
use crate::split;
use dsc_format::keys::KeyType;

use crate::rules::Rules;
use dsc_format::spec::EmptyContexts;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Context {
    pub group: Group,
    pub ctx_row: Option<u32>,
    pub split: u8,
}

/// One row column of the compile: where it comes from and how it is encoded.
pub(crate) struct BucketColumn<'a> {
    pub name: &'a str,
    pub join: Option<&'a Keyed>,
    pub categorical: bool,
    pub chain: &'a [Step],
}

/// One string column encoded to a fixed width: of the rows table (directly or through a join)
/// or of the context table.
pub(crate) struct BucketText<'a> {
    pub name: &'a str,
    pub join: Option<&'a Keyed>,
    pub context: bool,
    pub encoding: TextEncoding,
}

/// Everything a bucket needs that is shared by all of them.
pub(crate) struct Shared<'a> {
    /// What the stages read of the spec.
    pub rules: Rules<'a>,
    pub spill: &'a Spill,
    pub context: Option<&'a ContextSide>,
    pub splits: &'a split::Splits<'a>,
    pub columns: Vec<BucketColumn<'a>>,
    /// Targets, then context features: (name, is_target, chain).
    pub context_columns: Vec<(&'a str, bool, &'a [Step])>,
    /// String columns encoded to a fixed width: the rows table's first, then the context's.
    pub texts: Vec<BucketText<'a>>,
    /// Where the compile's time goes.
    pub phases: &'a Phases,
}

/// What only the whole input shows is wrong: kept per bucket, decided after all of them.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub(crate) struct Issues {
    /// Contexts with rows but no context row: count, rows, and the smallest key id's key and
    /// first row.
    pub unmatched: (usize, u64, Option<Unmatched>),
    /// Context rows with no rows: count and the first (global row, file, row, key).
    pub empty: (usize, Option<(u64, PathBuf, u64, String)>),
    /// Listed keys (key files) that are contexts.
    pub found: Vec<i64>,
}

/// The first context without a context row: its key id, its key as its user knows it, and the
/// file and row of its first row.
pub(crate) type Unmatched = (i64, String, PathBuf, u64);

/// What a statistic is about, for `stats.json`.
#[derive(Debug, Clone)]
pub(crate) struct ColumnId {
    pub name: String,
    pub table: &'static str,
    pub source_type: String,
    pub kind: Kind,
}

/// One bucket grouped into contexts, each with its split.
pub(crate) struct Prepared {
    pub table: RowsTable,
    /// The bucket's rows of the context table.
    pub ctx: Option<Keyed>,
    pub grouped: group::Groups,
    pub contexts: Vec<Context>,
    pub row_tags: Vec<u8>,
    /// Context-table rows of the stored contexts, ascending, with their splits.
    pub ctx_rows: Vec<u32>,
    pub ctx_tags: Vec<u8>,
    pub issues: Issues,
    pub truncated: usize,
}

/// The key at `row` of the key column `key` as its user knows it: the string, or the integer.
fn shown_key(key: &Column, row: usize) -> String {
    match key.str_at(row) {
        Some(s) => format!("{s:?}"),
        None => key
            .i64_at(row)
            .and_then(|k| KeyType::of_source_type(&key.info.name).integer_of(k))
            .unwrap_or_default(),
    }
}

/// The key of context `c` as its user knows it, from its first row (or its context row).
pub(crate) fn context_key(
    table: &RowsTable,
    perm: &[u32],
    c: &Context,
    ctx: Option<&Keyed>,
) -> String {
    match (c.group.len, ctx, c.ctx_row) {
        (0, Some(ctx), Some(r)) => shown_key(&ctx.table.columns[0], r as usize),
        _ => shown_key(&table.columns[0], perm[c.group.start] as usize),
    }
}

/// Refuses two distinct string keys in one group: their ids (hashes) are equal, and dsc never
/// merges two keys into one context. Both are in this bucket, as equal ids share a bucket.
fn check_one_key_per_group(table: &RowsTable, grouped: &group::Groups) -> Result<()> {
    let key = &table.columns[0];
    if key.info.kind != Kind::Str {
        return Ok(());
    }
    for g in &grouped.groups {
        let rows = &grouped.perm[g.start..g.start + g.len];
        let first = key.text_bytes(rows[0] as usize);
        if let Some(&r) = rows.iter().find(|&&r| key.text_bytes(r as usize) != first) {
            let first = key.str_at(rows[0] as usize);
            return Err(CompileError::KeyCollision {
                path: table.locate(r as usize).0.into(),
                column: table.wants[0].name.clone(),
                first: first.unwrap_or_default().into(),
                second: key.str_at(r as usize).unwrap_or_default().into(),
            });
        }
    }
    Ok(())
}

impl Shared<'_> {
    /// Loads bucket `b` and groups it; `max_len` truncates (none when `None`).
    pub fn prepare(&self, b: usize, max_len: Option<usize>) -> Result<Prepared> {
        let rules = self.rules;
        let phases = self.phases;
        let table = phases.time(Phase::Load, || self.spill.load(b))?;
        let key = &table.columns[0];
        let mut grouped = phases.time(Phase::Grouping, || group::by_key(&key.key_ids()));
        if let Some(order) = rules.order_by.and_then(|o| table.column(o)) {
            phases.time(Phase::Ordering, || group::order_groups(&mut grouped, order));
        }
        // After the ordering: a collision names the context's first row in sequence order.
        phases.time(Phase::Grouping, || {
            check_one_key_per_group(&table, &grouped)
        })?;
        let join = std::time::Instant::now();
        let mut issues = Issues::default();
        let mut contexts: Vec<Context> = Vec::with_capacity(grouped.groups.len());
        let ctx = self.context.map(|c| c.load(b)).transpose()?;
        match &ctx {
            None => contexts.extend(grouped.groups.iter().map(|&group| Context {
                group,
                ctx_row: None,
                split: TRAIN,
            })),
            Some(ctx) => {
                let ctx_key = &ctx.table.columns[0];
                let mut seen = vec![false; ctx.table.rows()];
                for g in &grouped.groups {
                    let first = grouped.perm[g.start] as usize;
                    match ctx.index.get(g.key) {
                        Some(r) => {
                            if let (Some(a), Some(b)) =
                                (ctx_key.text_bytes(r as usize), key.text_bytes(first))
                            {
                                if a != b {
                                    return Err(CompileError::KeyCollision {
                                        path: table.locate(first).0.into(),
                                        column: table.wants[0].name.clone(),
                                        first: String::from_utf8_lossy(a).into(),
                                        second: String::from_utf8_lossy(b).into(),
                                    });
                                }
                            }
                            seen[r as usize] = true;
                            contexts.push(Context {
                                group: *g,
                                ctx_row: Some(r),
                                split: TRAIN,
                            });
                        }
                        None => {
                            let u = &mut issues.unmatched;
                            u.0 += 1;
                            u.1 += g.len as u64;
                            if u.2.is_none() {
                                // Groups are ascending by key id: the first is the smallest.
                                let (path, row) = table.locate(first);
                                u.2 = Some((g.key, shown_key(key, first), path.into(), row));
                            }
                        }
                    }
                }
                let ctx_ids = ctx_key.key_ids();
                for (r, &was_seen) in seen.iter().enumerate() {
                    if was_seen {
                        continue;
                    }
                    issues.empty.0 += 1;
                    if issues.empty.1.is_none() {
                        // The bucket's context rows are in file order: the first is the smallest.
                        let (path, row) = ctx.table.locate(r);
                        let global = ctx.table.global_row(r);
                        issues.empty.1 = Some((global, path.into(), row, shown_key(ctx_key, r)));
                    }
                    if rules.empty_contexts == EmptyContexts::Keep {
                        contexts.push(Context {
                            group: Group {
                                key: ctx_ids[r],
                                start: 0,
                                len: 0,
                                kept_start: 0,
                                kept: 0,
                            },
                            ctx_row: Some(r as u32),
                            split: TRAIN,
                        });
                    }
                }
                contexts.sort_by_key(|c| c.group.key);
            }
        }
        let mut truncated = 0;
        if let Some(max_len) = max_len {
            // Sampling is seeded by the split seed, not the shuffle seed, so that a reshuffle
            // stores exactly the same rows.
            truncated = group::truncate(&mut grouped, max_len, rules.truncate, rules.split_seed);
            refresh_groups(&mut contexts, &grouped.groups);
        }
        for c in &mut contexts {
            let shown = || context_key(&table, &grouped.perm, c, ctx.as_ref());
            c.split = self
                .splits
                .of(c.group.key, &shown, ctx.as_ref().map(|k| (k, c.ctx_row)))?;
            if self.splits.is_listed(c.group.key) {
                issues.found.push(c.group.key);
            }
        }
        // Statistics describe every row of the stored contexts, also those cut by `max_len`.
        let mut row_tags = vec![DROPPED; table.rows()];
        for c in &contexts {
            let g = &c.group;
            for &r in &grouped.perm[g.start..g.start + g.len] {
                row_tags[r as usize] = c.split;
            }
        }
        let mut by_row: Vec<(u32, u8)> = contexts
            .iter()
            .filter_map(|c| c.ctx_row.map(|r| (r, c.split)))
            .collect();
        by_row.sort_unstable();
        let (ctx_rows, ctx_tags) = by_row.into_iter().unzip();
        phases.add(Phase::Join, join.elapsed());
        Ok(Prepared {
            table,
            ctx,
            grouped,
            contexts,
            row_tags,
            ctx_rows,
            ctx_tags,
            issues,
            truncated,
        })
    }

    /// The access to row column `i` in a bucket's table.
    pub fn access<'t>(&'t self, i: usize, table: &'t RowsTable) -> Access<'t> {
        let rc = &self.columns[i];
        match rc.join {
            None => Access {
                name: rc.name,
                table,
                column: table.column(rc.name).expect("read"),
                join: None,
            },
            Some(keyed) => Access {
                name: rc.name,
                table,
                column: keyed.column(rc.name).expect("read"),
                join: Some((table.column(&keyed.key).expect("join column read"), keyed)),
            },
        }
    }

    /// What row column `i` is, without a bucket at hand.
    pub fn column_id(&self, i: usize) -> ColumnId {
        let rc = &self.columns[i];
        let info = match rc.join {
            None => self.spill.type_of(rc.name),
            Some(keyed) => &keyed.column(rc.name).expect("read").info,
        };
        ColumnId {
            name: rc.name.into(),
            table: if rc.join.is_some() { "join" } else { "rows" },
            source_type: info.name.clone(),
            kind: info.kind,
        }
    }

    /// The access to context column `i` in a bucket's rows of the context table.
    pub fn context_access<'t>(&'t self, i: usize, ctx: &'t Keyed) -> Access<'t> {
        let name = self.context_columns[i].0;
        Access {
            name,
            table: &ctx.table,
            column: ctx.column(name).expect("read"),
            join: None,
        }
    }

    /// The access to string column `i` in a bucket: its rows table (`table`, a join through it)
    /// or its rows of the context table (`ctx`).
    pub fn text_access<'t>(
        &'t self,
        i: usize,
        table: &'t RowsTable,
        ctx: Option<&'t Keyed>,
    ) -> Access<'t> {
        let t = &self.texts[i];
        if t.context {
            let ctx = ctx.expect("a context string column needs a context table");
            return Access {
                name: t.name,
                table: &ctx.table,
                column: ctx.column(t.name).expect("read"),
                join: None,
            };
        }
        match t.join {
            None => Access {
                name: t.name,
                table,
                column: table.column(t.name).expect("read"),
                join: None,
            },
            Some(keyed) => Access {
                name: t.name,
                table,
                column: keyed.column(t.name).expect("read"),
                join: Some((table.column(&keyed.key).expect("join column read"), keyed)),
            },
        }
    }

    /// What string column `i` is, without a bucket at hand.
    pub fn text_id(&self, i: usize) -> ColumnId {
        let t = &self.texts[i];
        let (info, table) = match (t.context, t.join) {
            (true, _) => (
                self.context
                    .expect("a context string column needs a context table")
                    .type_of(t.name),
                "context",
            ),
            (false, Some(keyed)) => (&keyed.column(t.name).expect("read").info, "join"),
            (false, None) => (self.spill.type_of(t.name), "rows"),
        };
        ColumnId {
            name: t.name.into(),
            table,
            source_type: info.name.clone(),
            kind: info.kind,
        }
    }

    /// What context column `i` is, without a bucket at hand.
    pub fn context_column_id(&self, i: usize) -> ColumnId {
        let name = self.context_columns[i].0;
        let info = self
            .context
            .expect("context columns need a context table")
            .type_of(name);
        ColumnId {
            name: name.into(),
            table: "context",
            source_type: info.name.clone(),
            kind: info.kind,
        }
    }
}

fn refresh_groups(contexts: &mut [Context], groups: &[Group]) {
    // Both are ascending by key; kept-empty contexts have no group and keep their own.
    let mut gi = 0;
    for c in contexts.iter_mut() {
        if c.group.len == 0 {
            continue;
        }
        while groups[gi].key != c.group.key {
            gi += 1;
        }
        c.group = groups[gi];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::test_tables;

    /// Rows of two distinct string keys grouped under one id (a hash collision, forced by the
    /// ids given) are refused with both keys; one key's rows pass.
    #[test]
    fn one_group_of_two_keys_is_a_collision() {
        // Held in a dictionary (a key also coded as a category) and as plain strings.
        for plain in [false, true] {
            let table = test_tables::string_keys("rows.parquet", &["a", "b", "a", "c"], plain);
            let err = check_one_key_per_group(&table, &group::by_key(&[1, 1, 1, 2]))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("rows.parquet: keys \"a\" and \"b\" of column \"k\""),
                "{err}"
            );
            assert!(check_one_key_per_group(&table, &group::by_key(&[1, 2, 1, 3])).is_ok());
        }
    }
}
