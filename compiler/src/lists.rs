//! Rows tables whose sequences are list columns (one row per context: the layout of Hugging Face
//! `datasets`, Arrow and most exported event data). Each batch is read exploded to one row per
//! list element with the row's other columns repeated, as `pandas.DataFrame.explode` writes it,
//! so that everything after the read sees the exploded table and compiles it to the same bytes.
//! The row's own columns (targets, context features, the split) are the context table's.

use crate::column::{Column, TypeInfo};
use crate::error::{CompileError, Result};
use crate::read::Opened;
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;
use std::path::{Path, PathBuf};

/// Bits of an exploded row's global number that hold its element's position in its list: the
/// number is `list_row << ELEMENT_BITS | element`, which orders rows as the exploded table
/// orders them (by row, then element), so that ties of `order_by` keep list order.
pub(crate) const ELEMENT_BITS: u32 = 24;

/// The longest list a row may hold: its element's position must fit [`ELEMENT_BITS`] (and a
/// sequence that long is past any `max_len` a cache stores).
pub(crate) const MAX_ELEMENTS: usize = 1 << ELEMENT_BITS;

/// One batch of a list table, exploded.
pub(crate) struct Exploded {
    /// The wanted columns, one row per list element.
    pub columns: Vec<Column>,
    /// Each exploded row's global number (`list_row << ELEMENT_BITS | element`).
    pub origin: Vec<u64>,
}

/// The batch's wanted columns (`names`, of `types`) exploded. `base` is the global number of
/// its first row, `row_in_file` that row's place in `path`, for messages.
pub(crate) fn explode(
    batch: &RecordBatch,
    names: &[&str],
    types: &[TypeInfo],
    base: u64,
    (path, row_in_file): (&Path, u64),
) -> Result<Exploded> {
    let arrays: Vec<&ArrayRef> = names
        .iter()
        .map(|n| batch.column_by_name(n).expect("projected"))
        .collect();
    let lists: Vec<(usize, Vec<u32>)> = types
        .iter()
        .enumerate()
        .filter(|(_, t)| t.list)
        .map(|(i, _)| (i, lengths(arrays[i])))
        .collect();
    let n = batch.num_rows();
    let mut rows: Vec<u32> = Vec::new();
    let mut origin: Vec<u64> = Vec::new();
    for r in 0..n {
        let len = lists[0].1[r];
        if let Some((other, _)) = lists.iter().find(|(_, l)| l[r] != len) {
            let what: Vec<String> = lists
                .iter()
                .map(|(i, l)| format!("{} has {}", names[*i], l[r]))
                .collect();
            return Err(CompileError::ListRow {
                path: path.into(),
                row: row_in_file + r as u64,
                what: format!(
                    "the lists of columns {} and {} differ in length ({}): a row's lists are the \
                     steps of one sequence, one element per step each",
                    names[lists[0].0],
                    names[*other],
                    what.join(", ")
                ),
            });
        }
        if len as usize >= MAX_ELEMENTS {
            return Err(CompileError::ListRow {
                path: path.into(),
                row: row_in_file + r as u64,
                what: format!(
                    "column {} holds a list of {len} elements, more than the {MAX_ELEMENTS} a \
                     row may hold",
                    names[lists[0].0]
                ),
            });
        }
        let global = (base + r as u64) << ELEMENT_BITS;
        rows.extend(std::iter::repeat_n(r as u32, len as usize));
        origin.extend((0..u64::from(len)).map(|e| global | e));
    }
    let columns = types
        .iter()
        .zip(&arrays)
        .map(|(t, array)| {
            let mut out = Column::new(t.clone(), rows.len());
            if t.list {
                for values in elements(array) {
                    out.push_array(&values);
                }
            } else {
                // The row's value on every one of its elements.
                let mut whole = Column::new(t.clone(), n);
                whole.push_array(array);
                out.push_rows(&whole, &rows);
            }
            out
        })
        .collect();
    Ok(Exploded { columns, origin })
}

/// Each row's list length; a null list is empty.
fn lengths(array: &ArrayRef) -> Vec<u32> {
    let of = |i: usize, len: usize| if array.is_valid(i) { len as u32 } else { 0 };
    match array.data_type() {
        DataType::List(_) => {
            let l = array.as_list::<i32>();
            (0..l.len())
                .map(|i| of(i, l.value_length(i) as usize))
                .collect()
        }
        DataType::LargeList(_) => {
            let l = array.as_list::<i64>();
            (0..l.len())
                .map(|i| of(i, l.value_length(i) as usize))
                .collect()
        }
        DataType::FixedSizeList(_, size) => {
            (0..array.len()).map(|i| of(i, *size as usize)).collect()
        }
        other => unreachable!("{other} is not a list; classify() decides"),
    }
}

/// The elements of every valid row, in order, as few contiguous slices of the values as the
/// null lists allow (a null list may span values that are not its elements).
fn elements(array: &ArrayRef) -> Vec<ArrayRef> {
    let (values, spans): (ArrayRef, Vec<(usize, usize)>) = match array.data_type() {
        DataType::List(_) => offset_spans::<i32>(array),
        DataType::LargeList(_) => offset_spans::<i64>(array),
        DataType::FixedSizeList(_, size) => {
            let l = array.as_fixed_size_list();
            let size = *size as usize;
            let spans = (0..l.len()).map(|i| (i * size, (i + 1) * size)).collect();
            (l.values().clone(), spans)
        }
        other => unreachable!("{other} is not a list; classify() decides"),
    };
    let mut out = Vec::new();
    let mut run: Option<(usize, usize)> = None;
    for (i, (start, end)) in spans.into_iter().enumerate() {
        if !array.is_valid(i) || start == end {
            continue;
        }
        run = match run {
            Some((a, b)) if b == start => Some((a, end)),
            Some((a, b)) => {
                out.push(values.slice(a, b - a));
                Some((start, end))
            }
            None => Some((start, end)),
        };
    }
    if let Some((a, b)) = run {
        out.push(values.slice(a, b - a));
    }
    out
}

/// A list array's values and each row's span of them.
fn offset_spans<O: arrow_array::OffsetSizeTrait>(
    array: &ArrayRef,
) -> (ArrayRef, Vec<(usize, usize)>) {
    let l = array.as_list::<O>();
    let o = l.value_offsets();
    let spans = (0..l.len())
        .map(|i| (o[i].as_usize(), o[i + 1].as_usize()))
        .collect();
    (l.values().clone(), spans)
}

/// The buckets of a list table: those of the exploded table it is read as, whose footers count
/// its rows, so that the two compile to the same shards. A list column's footer counts its
/// elements plus one value per null or empty list, so the elements lie between that count less
/// the table's rows and the count itself; both ends nearly always give the same buckets, and
/// only when they do not is the column (`wants[column]`) read and its elements counted.
/// `size` gives the buckets of a row count. Returns the buckets and the elements' upper bound
/// (the rows the memory budget plans for).
pub(crate) fn sized_buckets<B: PartialEq>(
    opened: &[Opened],
    files: &[PathBuf],
    column: &crate::read::Want,
    size: impl Fn(u64) -> B,
) -> Result<(B, u64)> {
    let mut bounds = Some((0u64, 0u64));
    for o in opened {
        let index = o
            .schema
            .index_of(&column.name)
            .expect("checked by check_columns");
        bounds = match (bounds, o.leaf_values(index)) {
            (Some((lo, hi)), Some(values)) => {
                Some((lo + values.saturating_sub(o.rows), hi + values))
            }
            _ => None,
        };
    }
    match bounds {
        Some((lo, hi)) if size(lo) == size(hi) => Ok((size(hi), hi)),
        _ => {
            let exact = count_elements(files, column)?;
            Ok((size(exact), exact))
        }
    }
}

/// The elements of the list column `column` across `files`, read and counted.
fn count_elements(files: &[PathBuf], column: &crate::read::Want) -> Result<u64> {
    use rayon::prelude::*;
    files
        .par_iter()
        .map(|path| {
            let reader =
                crate::read::open(path)?.into_wanted_reader(std::slice::from_ref(column))?;
            let mut total = 0u64;
            for batch in reader {
                let batch = batch.map_err(|e| CompileError::parquet(path.clone(), None, e))?;
                total += lengths(batch.column(0))
                    .iter()
                    .map(|&l| u64::from(l))
                    .sum::<u64>();
            }
            Ok(total)
        })
        .collect::<Vec<Result<u64>>>()
        .into_iter()
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::builder::{Float64Builder, ListBuilder};
    use arrow_array::{Float64Array, Int64Array};
    use std::sync::Arc;

    fn types_of(batch: &RecordBatch) -> Vec<TypeInfo> {
        let schema = batch.schema();
        let fields = schema.fields().iter();
        fields
            .map(|f| crate::column::classify(f.data_type()).unwrap())
            .collect()
    }

    #[test]
    fn a_batch_explodes_as_pandas_explode_writes_it() {
        let mut x = ListBuilder::new(Float64Builder::new());
        for row in [
            Some(vec![Some(1.0), None]),
            None,
            Some(vec![]),
            Some(vec![Some(3.0)]),
        ] {
            match row {
                Some(v) => {
                    for e in v {
                        x.values().append_option(e);
                    }
                    x.append(true);
                }
                None => x.append(false),
            }
        }
        let batch = RecordBatch::try_from_iter([
            (
                "id",
                Arc::new(Int64Array::from(vec![7, 8, 9, 10])) as ArrayRef,
            ),
            ("x", Arc::new(x.finish()) as ArrayRef),
        ])
        .unwrap();
        let types = types_of(&batch);
        let e = explode(&batch, &["id", "x"], &types, 100, (Path::new("t"), 0)).unwrap();
        // Rows 7 (two elements) and 10 (one); the null and the empty list hold none.
        assert_eq!(e.columns[0].i64_at(0), Some(7));
        assert_eq!(e.columns[0].i64_at(2), Some(10));
        assert_eq!(e.columns[1].f64_at(0), Some(1.0));
        assert_eq!(
            e.columns[1].f64_at(1),
            None,
            "a null element stays null, for --nan"
        );
        assert_eq!(e.columns[1].f64_at(2), Some(3.0));
        assert_eq!(
            e.origin,
            vec![
                100 << ELEMENT_BITS,
                (100 << ELEMENT_BITS) | 1,
                103 << ELEMENT_BITS
            ]
        );
        // Lists of one row that differ in length are named with the row.
        let y = Arc::new(Float64Array::from(vec![1.0, 2.0, 3.0, 4.0]));
        let mut short = ListBuilder::new(Float64Builder::new());
        for _ in 0..4 {
            short.values().append_value(0.5);
            short.append(true);
        }
        let batch = RecordBatch::try_from_iter([
            (
                "id",
                Arc::new(Int64Array::from(vec![7, 8, 9, 10])) as ArrayRef,
            ),
            ("x", batch.column(1).clone()),
            ("t", Arc::new(short.finish()) as ArrayRef),
            ("y", y as ArrayRef),
        ])
        .unwrap();
        let types = types_of(&batch);
        let err = explode(
            &batch,
            &["id", "x", "t"],
            &types[..3],
            0,
            (Path::new("t.parquet"), 40),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            err.contains("t.parquet: row 40") && err.contains("x has 2, t has 1"),
            "{err}"
        );
    }

    #[test]
    fn a_list_table_gets_the_buckets_of_its_element_count_from_its_footer_or_a_count() {
        // Lists of 2, 0, null, 3 and 1 elements: 6 elements; the footer counts 8 values (one
        // for the empty and one for the null list) in 5 rows, bounding the elements to 3..=8.
        let mut x = ListBuilder::new(Float64Builder::new());
        for row in [Some(2), Some(0), None, Some(3), Some(1)] {
            match row {
                Some(n) => {
                    for e in 0..n {
                        x.values().append_value(f64::from(e));
                    }
                    x.append(true);
                }
                None => x.append(false),
            }
        }
        let batch = RecordBatch::try_from_iter([("x", Arc::new(x.finish()) as ArrayRef)]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lists.parquet");
        let file = std::fs::File::create(&path).unwrap();
        let mut writer = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let want = crate::read::Want {
            name: "x".into(),
            role: crate::read::Role::Numeric,
        };
        let opened = [crate::read::open(&path).unwrap()];
        assert_eq!(opened[0].leaf_values(0), Some(8));
        // One bucket below `at` rows, two from it: whether the bounds decide or the column is
        // counted, the buckets are those of the 6 elements.
        for at in 1..12u64 {
            let size = |rows: u64| u32::from(rows >= at);
            let (bits, planned) =
                sized_buckets(&opened, std::slice::from_ref(&path), &want, size).unwrap();
            assert_eq!(bits, u32::from(6 >= at), "split at {at} rows");
            assert!(planned >= 6, "the budget plans for at least the elements");
        }
    }
}
