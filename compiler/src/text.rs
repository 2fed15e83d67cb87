//! String columns encoded to a fixed width per row, each into a tensor of its own named after
//! the column: `bits` (a string of `0` and `1` as that many u8), `chars:W` (the characters as
//! i32 codes over the train split's characters, cut or padded to `W`) and `ngrams:N` (the set
//! of character `N`-grams as a multi-hot u8 vector over the train split's most frequent ones).
//!
//! The statistics pass counts each column's characters or grams per split (and, for bits, the
//! widths it meets and the first row that is not bits); the merge fits the encoding from the
//! train split and checks bits; the shards pass writes each row's values.

use crate::bucket::ColumnId;
use crate::column::Values;
use crate::encode::{Access, DROPPED, TRAIN};
use crate::error::{CompileError, Result};
use crate::plan::TextEncoding;
use dsc_format::manifest::{CODE_FIRST, CODE_UNKNOWN};
use dsc_format::spelling::OptionError;
use dsc_format::stats::{ColumnStats, VocabEntry};
use dsc_format::Encoding;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

/// N-grams kept at most unless the spec's `ngram_vocab` says otherwise.
pub const DEFAULT_NGRAM_VOCAB: usize = 4096;

/// A row that breaks a rule, kept with its global position so that the first in file order is
/// the one reported, whatever buckets and threads found it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Place {
    global: u64,
    path: PathBuf,
    row: u64,
    what: String,
}

impl Place {
    /// The earlier of `a` and `b` in file order.
    fn first(a: Option<Place>, b: Option<Place>) -> Option<Place> {
        match (a, b) {
            (Some(a), Some(b)) => Some(if b.global < a.global { b } else { a }),
            (a, b) => a.or(b),
        }
    }
}

/// One string column of some buckets: per split the count of each character (chars) or of the
/// rows holding each gram (ngrams), the rows and the nulls; for bits, the first row of each width
/// and the first row holding another character than `0` or `1`. Counts add, firsts take the
/// earlier: partials of any buckets merge in any order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct TextPartial {
    counts: Vec<BTreeMap<String, u64>>,
    rows: Vec<u64>,
    nulls: Vec<u64>,
    widths: BTreeMap<usize, Place>,
    bad: Option<Place>,
}

impl TextPartial {
    /// Gives a partial of no bucket its `splits` (empty) counts.
    pub fn ensure_splits(&mut self, splits: usize) {
        if self.counts.is_empty() {
            self.counts = vec![BTreeMap::new(); splits];
            self.rows = vec![0; splits];
            self.nulls = vec![0; splits];
        }
    }

    /// Adds `other` to `self`.
    pub fn add(&mut self, other: TextPartial) {
        if self.counts.is_empty() {
            *self = other;
            return;
        }
        for (s, theirs) in other.counts.into_iter().enumerate() {
            for (k, c) in theirs {
                *self.counts[s].entry(k).or_insert(0) += c;
            }
            self.rows[s] += other.rows[s];
            self.nulls[s] += other.nulls[s];
        }
        for (w, place) in other.widths {
            let mine = self.widths.remove(&w);
            let first = Place::first(mine, Some(place)).expect("one is given");
            self.widths.insert(w, first);
        }
        self.bad = Place::first(self.bad.take(), other.bad);
    }
}

/// Per split the rows holding each distinct string (by dictionary code), the nulls per split,
/// and each string's first row.
type Distinct = (Vec<HashMap<u32, u64>>, Vec<u64>, HashMap<u32, usize>);

/// The distinct strings of `access`'s column (dictionary codes) that the rows tagged `tags`
/// (`rows[i]`'s tag, or row `i`'s) hold, with per split the rows holding each, the nulls, and
/// the first row (global, file, row) of each.
fn distinct_rows(
    access: &Access,
    tags: &[u8],
    rows: Option<&[u32]>,
    splits: usize,
) -> Result<Distinct> {
    let Values::Str { .. } = &access.column.values else {
        unreachable!("an encoded string column is read as strings; checked when opened")
    };
    let mut counts = vec![HashMap::new(); splits];
    let mut nulls = vec![0u64; splits];
    let mut first: HashMap<u32, usize> = HashMap::new();
    for (i, &tag) in tags.iter().enumerate() {
        if tag == DROPPED {
            continue;
        }
        let row = rows.map_or(i, |r| r[i] as usize);
        let s = tag as usize;
        match access.source_row(row)?.and_then(|r| str_code(access, r)) {
            None => nulls[s] += 1,
            Some(code) => {
                *counts[s].entry(code).or_insert(0) += 1;
                first.entry(code).or_insert(row);
            }
        }
    }
    Ok((counts, nulls, first))
}

/// The dictionary code of row `r` of `access`'s string column, `None` when null.
fn str_code(access: &Access, r: usize) -> Option<u32> {
    let Values::Str { codes, .. } = &access.column.values else {
        return None;
    };
    access.column.is_valid(r).then(|| codes[r])
}

/// The string of dictionary code `code` of `access`'s column.
fn dict_str<'a>(access: &'a Access, code: u32) -> &'a str {
    let Values::Str { dict, .. } = &access.column.values else {
        unreachable!("a string column")
    };
    &dict[code as usize]
}

/// The distinct character `n`-grams of `s`.
fn grams(s: &str, n: usize) -> BTreeSet<String> {
    let chars: Vec<char> = s.chars().collect();
    chars
        .windows(n)
        .map(|w| w.iter().collect::<String>())
        .collect()
}

/// The statistics pass over one string column of one bucket (`tags`, `rows` as for
/// [`distinct_rows`]).
pub(crate) fn text_partial(
    access: &Access,
    tags: &[u8],
    rows: Option<&[u32]>,
    splits: usize,
    encoding: TextEncoding,
) -> Result<TextPartial> {
    let (by_code, nulls, first) = distinct_rows(access, tags, rows, splits)?;
    let mut part = TextPartial {
        counts: vec![BTreeMap::new(); splits],
        rows: by_code.iter().map(|m| m.values().sum()).collect(),
        nulls,
        widths: BTreeMap::new(),
        bad: None,
    };
    let place = |row: usize, what: String| {
        let (path, file_row) = access.table.locate(row);
        Place {
            global: access.table.global_row(row),
            path: path.into(),
            row: file_row,
            what,
        }
    };
    // Each distinct string is looked at once, whatever the rows holding it.
    let mut codes: Vec<u32> = first.keys().copied().collect();
    codes.sort_unstable();
    for code in codes {
        let s = dict_str(access, code);
        let row = first[&code];
        match encoding {
            TextEncoding::Bits => {
                let width = s.chars().count();
                let candidate = place(row, String::new());
                let mine = part.widths.remove(&width);
                part.widths.insert(
                    width,
                    Place::first(mine, Some(candidate)).expect("one is given"),
                );
                if let Some((at, c)) = s.chars().enumerate().find(|(_, c)| !matches!(c, '0' | '1'))
                {
                    let what = format!(
                        "{s:?} is not a bit string: character {at} is {c:?}, not '0' or '1'"
                    );
                    part.bad = Place::first(part.bad.take(), Some(place(row, what)));
                }
            }
            TextEncoding::Chars(_) => {
                for (split, m) in by_code.iter().enumerate() {
                    let Some(&n) = m.get(&code) else { continue };
                    for c in s.chars() {
                        *part.counts[split].entry(c.to_string()).or_insert(0) += n;
                    }
                }
            }
            TextEncoding::Ngrams(n) => {
                let set = grams(s, n);
                for (split, m) in by_code.iter().enumerate() {
                    let Some(&rows) = m.get(&code) else { continue };
                    for g in &set {
                        *part.counts[split].entry(g.clone()).or_insert(0) += rows;
                    }
                }
            }
        }
    }
    Ok(part)
}

/// A string column's fitted encoding and statistics (`all`, then each split), from the merged
/// partial; bits refused at the first row (in file order) that is not a bit string of the
/// column's width (the width of its first row).
pub(crate) fn merge_text(
    id: &ColumnId,
    column: &str,
    part: &TextPartial,
    encoding: TextEncoding,
    ngram_vocab: usize,
) -> Result<(Encoding, Vec<ColumnStats>)> {
    let refuse = |p: &Place, what: String| CompileError::BadText {
        path: p.path.clone(),
        column: column.into(),
        row: p.row,
        what,
    };
    let fitted = match encoding {
        TextEncoding::Bits => {
            if let Some(bad) = &part.bad {
                return Err(refuse(bad, bad.what.clone()));
            }
            let mut by_place: Vec<(&usize, &Place)> = part.widths.iter().collect();
            by_place.sort_by_key(|(_, p)| p.global);
            let Some(&(&width, first)) = by_place.first() else {
                return Err(CompileError::Spec(OptionError::new(
                    "encode",
                    format!("{column}=bits: the column holds no value to take the width from"),
                )));
            };
            if width == 0 {
                return Err(refuse(
                    first,
                    "an empty bit string, and the column's width is its first value's: a \
                     missing value is a null"
                        .into(),
                ));
            }
            if let Some((other, p)) = by_place.get(1) {
                return Err(refuse(
                    p,
                    format!(
                        "a bit string of {other} characters; the column's are {width} (its first \
                         value, {} row {})",
                        first.path.display(),
                        first.row
                    ),
                ));
            }
            Encoding::Bits { width }
        }
        TextEncoding::Chars(width) => Encoding::Chars {
            width,
            vocabulary: part
                .counts
                .get(TRAIN as usize)
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default(),
        },
        TextEncoding::Ngrams(n) => {
            let mut ranked: Vec<(&String, &u64)> = part
                .counts
                .get(TRAIN as usize)
                .map(|m| m.iter().collect())
                .unwrap_or_default();
            ranked.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            ranked.truncate(ngram_vocab);
            if ranked.is_empty() {
                return Err(CompileError::Spec(OptionError::new(
                    "encode",
                    format!(
                        "{column}=ngrams:{n}: no string of the train split holds {n} characters, \
                         so there is no gram to encode (give a shorter N)"
                    ),
                )));
            }
            Encoding::Ngrams {
                n,
                vocabulary: ranked.into_iter().map(|(g, _)| g.clone()).collect(),
            }
        }
    };
    Ok((fitted, text_stats(id, part, encoding)))
}

/// A string column's statistics (`all`, then each split) from its partials.
pub(crate) fn text_stats(
    id: &ColumnId,
    part: &TextPartial,
    encoding: TextEncoding,
) -> Vec<ColumnStats> {
    let splits = part.counts.len();
    let build = |counts: &BTreeMap<String, u64>, rows: u64, nulls: u64| {
        let mut s = id.empty_stats([nulls, 0, 0], rows);
        if !matches!(encoding, TextEncoding::Bits) {
            let mut entries: Vec<(&String, &u64)> = counts.iter().collect();
            entries.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            s.distinct = Some(entries.len() as u64);
            s.vocabulary = Some(
                entries
                    .into_iter()
                    .map(|(k, &count)| VocabEntry {
                        value: k.clone().into(),
                        count,
                    })
                    .collect(),
            );
        }
        s
    };
    let mut all = BTreeMap::new();
    for split in &part.counts {
        for (k, c) in split {
            *all.entry(k.clone()).or_insert(0) += c;
        }
    }
    let mut stats = vec![build(&all, part.rows.iter().sum(), part.nulls.iter().sum())];
    stats.extend((0..splits).map(|s| build(&part.counts[s], part.rows[s], part.nulls[s])));
    stats
}

/// Writes a string column's rows as their fixed-width values.
pub(crate) struct TextCoder<'a> {
    access: Access<'a>,
    coded: Coded,
}

enum Coded {
    Bits(usize),
    Chars {
        width: usize,
        codes: HashMap<char, i32>,
    },
    Ngrams {
        n: usize,
        index: HashMap<String, usize>,
    },
}

impl<'a> TextCoder<'a> {
    /// The coder of `access`'s column, fitted as `encoding`.
    pub fn new(access: Access<'a>, encoding: &Encoding) -> TextCoder<'a> {
        let coded = match encoding {
            Encoding::Bits { width } => Coded::Bits(*width),
            Encoding::Chars { width, vocabulary } => Coded::Chars {
                width: *width,
                codes: vocabulary
                    .iter()
                    .enumerate()
                    .filter_map(|(i, c)| Some((c.chars().next()?, CODE_FIRST + i as i32)))
                    .collect(),
            },
            Encoding::Ngrams { n, vocabulary } => Coded::Ngrams {
                n: *n,
                index: vocabulary
                    .iter()
                    .enumerate()
                    .map(|(i, g)| (g.clone(), i))
                    .collect(),
            },
            other => unreachable!("not a string encoding: {other:?}"),
        };
        TextCoder { access, coded }
    }

    /// Writes row `row`'s values into `dst` (one row's width, zeroed): a null row stays zeros.
    pub fn write(&self, row: usize, dst: &mut [u8]) -> Result<()> {
        let Some(code) = self
            .access
            .source_row(row)?
            .and_then(|r| str_code(&self.access, r))
        else {
            return Ok(());
        };
        let s = dict_str(&self.access, code);
        match &self.coded {
            Coded::Bits(width) => {
                // Checked by the statistics pass: a bit string of the column's width.
                for (d, c) in dst.iter_mut().zip(s.chars()).take(*width) {
                    *d = u8::from(c == '1');
                }
            }
            Coded::Chars { width, codes } => {
                for (d, c) in dst.chunks_exact_mut(4).zip(s.chars()).take(*width) {
                    let code = codes.get(&c).copied().unwrap_or(CODE_UNKNOWN);
                    d.copy_from_slice(&code.to_le_bytes());
                }
            }
            Coded::Ngrams { n, index } => {
                for g in grams(s, *n) {
                    if let Some(&i) = index.get(&g) {
                        dst[i] = 1;
                    }
                }
            }
        }
        Ok(())
    }
}
