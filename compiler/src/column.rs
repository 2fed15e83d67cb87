//! In-memory columns: the values of one source column across all rows, converted from Arrow to a
//! few compact representations.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Date64Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, TimeUnit};
use dsc_format::keys;
use std::borrow::Cow;
use std::collections::HashMap;

/// The logical type of a source column, as far as dsc cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Signed or unsigned integer that fits i64.
    Int,
    /// Float64.
    F64,
    /// Float32.
    F32,
    /// Boolean.
    Bool,
    /// UTF-8 string.
    Str,
    /// Timestamp or date: stored as integer ticks; `scale` converts ticks to seconds.
    Time,
}

/// A classified Arrow type: the kind and how to show it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TypeInfo {
    pub kind: Kind,
    /// Seconds per tick for [`Kind::Time`]; 1 otherwise.
    pub scale: f64,
    /// The Arrow type as manifests record it (`Int64`, `Utf8`, `Timestamp(Millisecond)`): part
    /// of the format, so never reworded.
    pub name: String,
    /// The type as a user knows it from Arrow, pandas and Parquet tools (`int64`, `string`,
    /// `timestamp[ms]`), for messages ([`type_name`]).
    pub shown: String,
    /// A list of values of this type (`list<double>`): a whole sequence in one row, read
    /// exploded to one row per element (`crate::lists`). `kind`, `scale` and `name` are the
    /// element's, as the exploded column's would be.
    pub list: bool,
    /// Held as plain strings rather than a dictionary ([`Values::Plain`]): set for a string key
    /// that serves no other role, by the recipe that reads it.
    pub plain: bool,
}

/// `dt` as a user knows it: Arrow's own lowercase spelling, as pyarrow prints a schema (`int64`,
/// `uint64`, `double`, `string`, `large_string`, `bool`, `timestamp[ms, tz=UTC]`, `date32`,
/// `list<double>`, `fixed_size_binary[16]`, `dictionary<string>`), never Rust's debug form.
pub(crate) fn type_name(dt: &DataType) -> String {
    let unit = |u: &TimeUnit| match u {
        TimeUnit::Second => "s",
        TimeUnit::Millisecond => "ms",
        TimeUnit::Microsecond => "us",
        TimeUnit::Nanosecond => "ns",
    };
    match dt {
        DataType::Null => "null".into(),
        DataType::Boolean => "bool".into(),
        DataType::Int8 => "int8".into(),
        DataType::Int16 => "int16".into(),
        DataType::Int32 => "int32".into(),
        DataType::Int64 => "int64".into(),
        DataType::UInt8 => "uint8".into(),
        DataType::UInt16 => "uint16".into(),
        DataType::UInt32 => "uint32".into(),
        DataType::UInt64 => "uint64".into(),
        DataType::Float16 => "halffloat".into(),
        DataType::Float32 => "float".into(),
        DataType::Float64 => "double".into(),
        DataType::Utf8 => "string".into(),
        DataType::LargeUtf8 => "large_string".into(),
        DataType::Utf8View => "string_view".into(),
        DataType::Binary => "binary".into(),
        DataType::LargeBinary => "large_binary".into(),
        DataType::BinaryView => "binary_view".into(),
        DataType::FixedSizeBinary(n) => format!("fixed_size_binary[{n}]"),
        DataType::Date32 => "date32".into(),
        DataType::Date64 => "date64".into(),
        DataType::Time32(u) => format!("time32[{}]", unit(u)),
        DataType::Time64(u) => format!("time64[{}]", unit(u)),
        DataType::Duration(u) => format!("duration[{}]", unit(u)),
        DataType::Timestamp(u, None) => format!("timestamp[{}]", unit(u)),
        DataType::Timestamp(u, Some(tz)) => format!("timestamp[{}, tz={tz}]", unit(u)),
        DataType::Decimal128(p, s) | DataType::Decimal256(p, s) => format!("decimal({p}, {s})"),
        DataType::List(f) => format!("list<{}>", type_name(f.data_type())),
        DataType::LargeList(f) => format!("large_list<{}>", type_name(f.data_type())),
        DataType::ListView(f) => format!("list_view<{}>", type_name(f.data_type())),
        DataType::FixedSizeList(f, n) => {
            format!("fixed_size_list<{}>[{n}]", type_name(f.data_type()))
        }
        DataType::Struct(fields) => {
            let inner: Vec<String> = fields
                .iter()
                .map(|f| format!("{}: {}", f.name(), type_name(f.data_type())))
                .collect();
            format!("struct<{}>", inner.join(", "))
        }
        DataType::Map(f, _) => match f.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => format!(
                "map<{}, {}>",
                type_name(kv[0].data_type()),
                type_name(kv[1].data_type())
            ),
            _ => "map".into(),
        },
        DataType::Dictionary(_, value) => format!("dictionary<{}>", type_name(value)),
        other => other.to_string().to_lowercase(),
    }
}

/// Classifies an Arrow type, or `None` if dsc cannot use it. A list (`list`, `large_list`,
/// `fixed_size_list`) of a usable type is its element's type with `list` set.
pub(crate) fn classify(dt: &DataType) -> Option<TypeInfo> {
    if let DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) = dt {
        let element = classify(f.data_type()).filter(|t| !t.list)?;
        return Some(TypeInfo {
            list: true,
            shown: type_name(dt),
            ..element
        });
    }
    let (kind, scale) = match dt {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        // Read as its bits in an i64: a key or a category, never a number (Role::accepts).
        | DataType::UInt64 => (Kind::Int, 1.0),
        DataType::Float64 => (Kind::F64, 1.0),
        DataType::Float32 => (Kind::F32, 1.0),
        DataType::Boolean => (Kind::Bool, 1.0),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => (Kind::Str, 1.0),
        // Every string kind Arrow has, dictionary-encoded or not (polars' Categorical and
        // Enum arrive as dictionaries of string views).
        DataType::Dictionary(_, value)
            if matches!(
                **value,
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
            ) =>
        {
            (Kind::Str, 1.0)
        }
        // Identifiers (UUIDs, hashes) read as text: a UUID in its usual spelling, other bytes
        // as lowercase hex (`dsc_format::keys`).
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => (Kind::Str, 1.0),
        DataType::Timestamp(unit, _) => (Kind::Time, unit_scale(*unit)),
        DataType::Date32 => (Kind::Time, 86_400.0),
        DataType::Date64 => (Kind::Time, 1e-3),
        _ => return None,
    };
    let name = match dt {
        DataType::Dictionary(_, _) => "Utf8".to_string(),
        DataType::LargeUtf8 | DataType::Utf8View => "Utf8".to_string(),
        DataType::LargeBinary | DataType::BinaryView => "Binary".to_string(),
        DataType::Timestamp(unit, _) => format!("Timestamp({unit:?})"),
        other => format!("{other:?}"),
    };
    Some(TypeInfo {
        kind,
        scale,
        name,
        shown: type_name(dt),
        list: false,
        plain: false,
    })
}

fn unit_scale(unit: TimeUnit) -> f64 {
    match unit {
        TimeUnit::Second => 1.0,
        TimeUnit::Millisecond => 1e-3,
        TimeUnit::Microsecond => 1e-6,
        TimeUnit::Nanosecond => 1e-9,
    }
}

/// A string dictionary's index: strings hashed by xxh3 rather than SipHash (its DoS resistance
/// buys nothing here, and string keys look up every row: SipHash was 8% of a compile).
pub(crate) type Lookup = HashMap<String, u32, std::hash::BuildHasherDefault<BytesHasher>>;

/// xxh3 of the bytes written, for [`Lookup`].
#[derive(Debug, Default)]
pub(crate) struct BytesHasher(u64);

impl std::hash::Hasher for BytesHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0 = xxhash_rust::xxh3::xxh3_64_with_seed(bytes, self.0);
    }

    fn write_u8(&mut self, i: u8) {
        // `str`'s terminator: mixed in without a second pass over the bytes.
        self.0 = (self.0 ^ u64::from(i)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The values of a column.
#[derive(Debug)]
pub(crate) enum Values {
    Int(Vec<i64>),
    F64(Vec<f64>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    /// Strings as they are, with no dictionary: a key column of mostly distinct values (a
    /// customer id per customer), where interning every value in every bucket's dictionary cost
    /// more than the rest of the compile. Row `i` is `bytes[ends[i - 1]..ends[i]]`.
    Plain {
        ends: Vec<u64>,
        bytes: Vec<u8>,
    },
    /// Codes into `dict`; after [`Column::finish`] the dictionary is sorted, so code order is
    /// value order.
    Str {
        codes: Vec<u32>,
        dict: Vec<String>,
        lookup: Lookup,
    },
}

/// One column: values, validity and type.
#[derive(Debug)]
pub(crate) struct Column {
    pub info: TypeInfo,
    pub values: Values,
    /// `valid[i]` is false where row `i` is null; `None` when no row is null.
    pub valid: Option<Vec<bool>>,
    len: usize,
}

impl Column {
    pub fn new(info: TypeInfo, capacity: usize) -> Self {
        let values = match info.kind {
            Kind::Int | Kind::Time => Values::Int(Vec::with_capacity(capacity)),
            Kind::F64 => Values::F64(Vec::with_capacity(capacity)),
            Kind::F32 => Values::F32(Vec::with_capacity(capacity)),
            Kind::Bool => Values::Bool(Vec::with_capacity(capacity)),
            Kind::Str if info.plain => Values::Plain {
                ends: Vec::with_capacity(capacity),
                bytes: Vec::new(),
            },
            Kind::Str => Values::Str {
                codes: Vec::with_capacity(capacity),
                dict: Vec::new(),
                lookup: Lookup::default(),
            },
        };
        Column {
            info,
            values,
            valid: None,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Appends an Arrow array of this column's type.
    pub fn push_array(&mut self, array: &ArrayRef) {
        let n = array.len();
        if array.null_count() > 0 || self.valid.is_some() {
            let valid = self.valid.get_or_insert_with(|| vec![true; self.len]);
            valid.extend((0..n).map(|i| array.is_valid(i)));
        }
        match &mut self.values {
            Values::Int(v) => push_ints(v, array),
            Values::F64(v) => v.extend(array.as_primitive::<Float64Type>().values().iter()),
            Values::F32(v) => v.extend(array.as_primitive::<Float32Type>().values().iter()),
            Values::Bool(v) => {
                let b = array.as_boolean();
                v.extend((0..n).map(|i| b.value(i)));
            }
            Values::Plain { ends, bytes } => push_plain(ends, bytes, array),
            Values::Str {
                codes,
                dict,
                lookup,
            } => push_strings(codes, dict, lookup, array),
        }
        self.len += n;
    }

    /// Appends another column of the same type (the next file's rows).
    pub fn append(&mut self, other: Column) {
        if other.valid.is_some() || self.valid.is_some() {
            let len = self.len;
            let valid = self.valid.get_or_insert_with(|| vec![true; len]);
            match other.valid {
                Some(v) => valid.extend(v),
                None => valid.extend(std::iter::repeat_n(true, other.len)),
            }
        }
        self.len += other.len;
        match (&mut self.values, other.values) {
            (Values::Int(a), Values::Int(b)) => a.extend(b),
            (Values::F64(a), Values::F64(b)) => a.extend(b),
            (Values::F32(a), Values::F32(b)) => a.extend(b),
            (Values::Bool(a), Values::Bool(b)) => a.extend(b),
            (Values::Plain { ends, bytes }, Values::Plain { ends: e, bytes: b }) => {
                let base = bytes.len() as u64;
                ends.extend(e.into_iter().map(|x| x + base));
                bytes.extend(b);
            }
            (
                Values::Str {
                    codes,
                    dict,
                    lookup,
                    ..
                },
                Values::Str {
                    codes: other_codes,
                    dict: other_dict,
                    ..
                },
            ) => {
                let remap: Vec<u32> = other_dict
                    .into_iter()
                    .map(|s| intern(dict, lookup, s))
                    .collect();
                // Null rows hold code 0 even when the dictionary is empty.
                codes.extend(
                    other_codes
                        .into_iter()
                        .map(|c| remap.get(c as usize).copied().unwrap_or(0)),
                );
            }
            _ => unreachable!("columns of one name share a kind; checked when files are opened"),
        }
    }

    /// Appends the rows `rows` of `src` (a column of the same kind), in that order.
    pub fn push_rows(&mut self, src: &Column, rows: &[u32]) {
        if src.valid.is_some() || self.valid.is_some() {
            let len = self.len;
            let valid = self.valid.get_or_insert_with(|| vec![true; len]);
            valid.extend(rows.iter().map(|&r| src.is_valid(r as usize)));
        }
        self.len += rows.len();
        match (&mut self.values, &src.values) {
            (Values::Int(a), Values::Int(b)) => a.extend(rows.iter().map(|&r| b[r as usize])),
            (Values::F64(a), Values::F64(b)) => a.extend(rows.iter().map(|&r| b[r as usize])),
            (Values::F32(a), Values::F32(b)) => a.extend(rows.iter().map(|&r| b[r as usize])),
            (Values::Bool(a), Values::Bool(b)) => a.extend(rows.iter().map(|&r| b[r as usize])),
            (Values::Plain { ends, bytes }, Values::Plain { .. }) => {
                for &r in rows {
                    bytes.extend_from_slice(src.plain_bytes(r as usize));
                    ends.push(bytes.len() as u64);
                }
            }
            (
                Values::Str {
                    codes,
                    dict,
                    lookup,
                },
                Values::Str {
                    codes: src_codes,
                    dict: src_dict,
                    ..
                },
            ) => {
                for &r in rows {
                    let code = match src_dict.get(src_codes[r as usize] as usize) {
                        Some(s) => match lookup.get(s) {
                            Some(&c) => c,
                            None => intern(dict, lookup, s.clone()),
                        },
                        // A null row of a column with no strings at all.
                        None => 0,
                    };
                    codes.push(code);
                }
            }
            _ => unreachable!("columns of one name share a kind; checked when files are opened"),
        }
    }

    /// Bytes this column holds in memory, roughly: for memory budgets. Vectors count what they
    /// have reserved (growing doubles it); a string counts about 128 bytes (held in the
    /// dictionary and as the lookup's key, each with its allocation and map overhead).
    pub fn heap_bytes(&self) -> usize {
        let values = match &self.values {
            Values::Int(v) => v.capacity() * 8,
            Values::F64(v) => v.capacity() * 8,
            Values::F32(v) => v.capacity() * 4,
            Values::Bool(v) => v.capacity(),
            Values::Plain { ends, bytes } => ends.capacity() * 8 + bytes.capacity(),
            Values::Str { codes, dict, .. } => codes.capacity() * 4 + dict.len() * 128,
        };
        values + self.valid.as_ref().map_or(0, Vec::capacity)
    }

    /// Appends this column to a spill: length, validity, then values (strings as their
    /// dictionary and codes).
    pub fn write_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.len as u64).to_le_bytes());
        match &self.valid {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                out.extend(v.iter().map(|&b| u8::from(b)));
            }
        }
        match &self.values {
            Values::Int(v) => put_narrow(out, v),
            Values::F64(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Values::F32(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Values::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
            Values::Plain { ends, bytes } => {
                ends.iter()
                    .for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
                out.extend_from_slice(bytes);
            }
            Values::Str { codes, dict, .. } => {
                out.extend_from_slice(&(dict.len() as u64).to_le_bytes());
                for s in dict {
                    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
                    out.extend_from_slice(s.as_bytes());
                }
                codes
                    .iter()
                    .for_each(|c| out.extend_from_slice(&c.to_le_bytes()));
            }
        }
    }

    /// Reads a column written by [`Column::write_to`] from the front of `bytes`, advancing it,
    /// onto the end of this column (a bucket's piece after the pieces before it), with no
    /// column of the piece's own in between. Spills are written and read by this process (or by
    /// the same version of dsc on the same kind of machine); a malformed one is a bug, not bad
    /// input.
    pub fn read_onto(&mut self, bytes: &mut &[u8]) {
        fn take<'b>(bytes: &mut &'b [u8], n: usize) -> &'b [u8] {
            let (head, tail) = bytes.split_at(n);
            *bytes = tail;
            head
        }
        fn u64_of(bytes: &mut &[u8]) -> u64 {
            u64::from_le_bytes(take(bytes, 8).try_into().expect("8 bytes"))
        }
        let len = u64_of(bytes) as usize;
        let valid = match take(bytes, 1)[0] {
            0 => None,
            _ => Some(take(bytes, len)),
        };
        if valid.is_some() || self.valid.is_some() {
            let before = self.len;
            let all = self.valid.get_or_insert_with(|| vec![true; before]);
            match valid {
                Some(v) => all.extend(v.iter().map(|&b| b != 0)),
                None => all.extend(std::iter::repeat_n(true, len)),
            }
        }
        self.len += len;
        match &mut self.values {
            Values::Int(v) => take_narrow(bytes, len, v),
            Values::F64(v) => v.extend(
                take(bytes, len * 8)
                    .chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))),
            ),
            Values::F32(v) => v.extend(
                take(bytes, len * 4)
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))),
            ),
            Values::Bool(v) => v.extend(take(bytes, len).iter().map(|&b| b != 0)),
            Values::Plain { ends, bytes: text } => {
                // The piece's ends count from its own first byte.
                let base = text.len() as u64;
                let end = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("8 bytes"));
                let raw = take(bytes, len * 8);
                let total = raw.chunks_exact(8).last().map_or(0, end) as usize;
                ends.extend(raw.chunks_exact(8).map(|c| end(c) + base));
                text.extend_from_slice(take(bytes, total));
            }
            Values::Str {
                codes,
                dict,
                lookup,
            } => {
                let n = u64_of(bytes) as usize;
                let remap: Vec<u32> = (0..n)
                    .map(|_| {
                        let l = u64_of(bytes) as usize;
                        let s = String::from_utf8(take(bytes, l).to_vec()).expect("spilled UTF-8");
                        intern(dict, lookup, s)
                    })
                    .collect();
                // Null rows hold code 0 even when the piece's dictionary is empty.
                codes.extend(take(bytes, len * 4).chunks_exact(4).map(|c| {
                    let c = u32::from_le_bytes(c.try_into().expect("4 bytes"));
                    remap.get(c as usize).copied().unwrap_or(0)
                }));
            }
        }
    }

    /// Sorts a string dictionary so that codes follow value order; a no-op for other kinds.
    pub fn finish(&mut self) {
        if let Values::Str {
            codes,
            dict,
            lookup,
        } = &mut self.values
        {
            let mut order: Vec<u32> = (0..dict.len() as u32).collect();
            order.sort_by(|&a, &b| dict[a as usize].cmp(&dict[b as usize]));
            let mut remap = vec![0u32; dict.len()];
            for (new, &old) in order.iter().enumerate() {
                remap[old as usize] = new as u32;
            }
            for c in codes.iter_mut() {
                *c = remap.get(*c as usize).copied().unwrap_or(0);
            }
            let mut sorted: Vec<String> = Vec::with_capacity(dict.len());
            for &old in &order {
                sorted.push(std::mem::take(&mut dict[old as usize]));
            }
            *dict = sorted;
            lookup.clear();
        }
    }

    pub fn is_valid(&self, row: usize) -> bool {
        self.valid.as_ref().is_none_or(|v| v[row])
    }

    /// The value as a number (timestamps in seconds, booleans 0/1), `None` when null or a string.
    #[inline]
    pub fn f64_at(&self, row: usize) -> Option<f64> {
        if !self.is_valid(row) {
            return None;
        }
        match &self.values {
            Values::Int(v) => Some(if self.info.kind == Kind::Time {
                v[row] as f64 * self.info.scale
            } else {
                v[row] as f64
            }),
            Values::F64(v) => Some(v[row]),
            Values::F32(v) => Some(f64::from(v[row])),
            Values::Bool(v) => Some(if v[row] { 1.0 } else { 0.0 }),
            Values::Str { .. } | Values::Plain { .. } => None,
        }
    }

    /// The key ids of a key column (`dsc_format::keys`): integers are their own ids, strings
    /// are hashed (a dictionary's once per distinct string, plain strings row by row).
    pub fn key_ids(&self) -> Cow<'_, [i64]> {
        match &self.values {
            Values::Int(v) => Cow::Borrowed(v),
            Values::Plain { .. } => Cow::Owned(
                (0..self.len)
                    .map(|r| keys::bytes_id(self.plain_bytes(r)))
                    .collect(),
            ),
            Values::Str { codes, dict, .. } => {
                let ids: Vec<i64> = dict.iter().map(|s| keys::text_id(s)).collect();
                // A null row holds code 0 even where the dictionary is empty; keys have no
                // nulls (refused when read), so that id is never used.
                Cow::Owned(
                    codes
                        .iter()
                        .map(|&c| ids.get(c as usize).copied().unwrap_or(0))
                        .collect(),
                )
            }
            _ => unreachable!("key columns are integers or strings; checked when opened"),
        }
    }

    /// The string at `row` of a string column (`None` when null or not a string column).
    #[inline]
    pub fn str_at(&self, row: usize) -> Option<&str> {
        match &self.values {
            Values::Plain { .. } if self.is_valid(row) => {
                Some(std::str::from_utf8(self.plain_bytes(row)).expect("read from UTF-8"))
            }
            Values::Str { codes, dict, .. } if self.is_valid(row) => {
                dict.get(codes[row] as usize).map(String::as_str)
            }
            _ => None,
        }
    }

    /// The bytes of the string at `row` (`None` when null or not a string column): what
    /// comparing keys row by row needs, without checking UTF-8 again on every row.
    #[inline]
    pub fn text_bytes(&self, row: usize) -> Option<&[u8]> {
        match &self.values {
            Values::Plain { .. } if self.is_valid(row) => Some(self.plain_bytes(row)),
            Values::Str { codes, dict, .. } if self.is_valid(row) => {
                dict.get(codes[row] as usize).map(String::as_bytes)
            }
            _ => None,
        }
    }

    /// Row `row`'s bytes in a plain string column.
    #[inline]
    fn plain_bytes(&self, row: usize) -> &[u8] {
        let Values::Plain { ends, bytes } = &self.values else {
            unreachable!("a plain string column")
        };
        let start = if row == 0 { 0 } else { ends[row - 1] as usize };
        &bytes[start..ends[row] as usize]
    }

    /// The integer value, for key and join columns.
    #[inline]
    pub fn i64_at(&self, row: usize) -> Option<i64> {
        if !self.is_valid(row) {
            return None;
        }
        match &self.values {
            Values::Int(v) => Some(v[row]),
            _ => None,
        }
    }
}

fn intern(dict: &mut Vec<String>, lookup: &mut Lookup, s: String) -> u32 {
    if let Some(&code) = lookup.get(&s) {
        return code;
    }
    let code = dict.len() as u32;
    lookup.insert(s.clone(), code);
    dict.push(s);
    code
}

fn push_ints(v: &mut Vec<i64>, array: &ArrayRef) {
    macro_rules! ext {
        ($t:ty) => {
            v.extend(
                array
                    .as_primitive::<$t>()
                    .values()
                    .iter()
                    .map(|&x| x as i64),
            )
        };
    }
    match array.data_type() {
        DataType::Int8 => ext!(Int8Type),
        DataType::Int16 => ext!(Int16Type),
        DataType::Int32 => ext!(Int32Type),
        DataType::Int64 => ext!(Int64Type),
        DataType::UInt8 => ext!(UInt8Type),
        DataType::UInt16 => ext!(UInt16Type),
        DataType::UInt32 => ext!(UInt32Type),
        DataType::UInt64 => ext!(UInt64Type),
        DataType::Date32 => ext!(Date32Type),
        DataType::Date64 => ext!(Date64Type),
        DataType::Timestamp(TimeUnit::Second, _) => ext!(TimestampSecondType),
        DataType::Timestamp(TimeUnit::Millisecond, _) => ext!(TimestampMillisecondType),
        DataType::Timestamp(TimeUnit::Microsecond, _) => ext!(TimestampMicrosecondType),
        DataType::Timestamp(TimeUnit::Nanosecond, _) => ext!(TimestampNanosecondType),
        other => unreachable!("{other:?} is not an integer kind; classify() decides"),
    }
}

fn push_strings(
    codes: &mut Vec<u32>,
    dict: &mut Vec<String>,
    lookup: &mut Lookup,
    array: &ArrayRef,
) {
    each_string(array, &mut |s: Option<&str>| {
        let code = match s {
            Some(s) => match lookup.get(s) {
                Some(&c) => c,
                None => intern(dict, lookup, s.to_string()),
            },
            None => 0,
        };
        codes.push(code);
    });
}

/// Appends each string of `array` to a plain column: its bytes, and where they end.
fn push_plain(ends: &mut Vec<u64>, bytes: &mut Vec<u8>, array: &ArrayRef) {
    ends.reserve(array.len());
    each_string(array, &mut |s: Option<&str>| {
        bytes.extend_from_slice(s.unwrap_or("").as_bytes());
        ends.push(bytes.len() as u64);
    });
}

/// Calls `push` with each value of a string (or binary) array as text, `None` where null.
fn each_string(array: &ArrayRef, push: &mut dyn FnMut(Option<&str>)) {
    match array.data_type() {
        DataType::Utf8 => array.as_string::<i32>().iter().for_each(&mut *push),
        DataType::LargeUtf8 => array.as_string::<i64>().iter().for_each(&mut *push),
        DataType::Utf8View => array.as_string_view().iter().for_each(&mut *push),
        DataType::Dictionary(_, _) => {
            let any = array.as_any_dictionary();
            let keys = any.normalized_keys();
            let values = any.values();
            let strings: Vec<Option<&str>> = match values.data_type() {
                DataType::Utf8 => values.as_string::<i32>().iter().collect(),
                DataType::Utf8View => values.as_string_view().iter().collect(),
                _ => values.as_string::<i64>().iter().collect(),
            };
            for (i, k) in keys.iter().enumerate() {
                push(if array.is_valid(i) { strings[*k] } else { None });
            }
        }
        // Binary spelled as text in one reused buffer: a new String only for a new key.
        DataType::FixedSizeBinary(16) => {
            let b = array.as_fixed_size_binary();
            let mut text = String::with_capacity(36);
            for i in 0..b.len() {
                text.clear();
                let valid = b.is_valid(i);
                if valid {
                    keys::write_uuid(b.value(i).try_into().expect("16 bytes"), &mut text);
                }
                push(valid.then_some(text.as_str()));
            }
        }
        DataType::FixedSizeBinary(_)
        | DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView => {
            let values: Box<dyn Iterator<Item = Option<&[u8]>>> = match array.data_type() {
                DataType::FixedSizeBinary(_) => {
                    let b = array.as_fixed_size_binary();
                    Box::new((0..b.len()).map(move |i| b.is_valid(i).then(|| b.value(i))))
                }
                DataType::Binary => Box::new(array.as_binary::<i32>().iter()),
                DataType::LargeBinary => Box::new(array.as_binary::<i64>().iter()),
                _ => Box::new(array.as_binary_view().iter()),
            };
            let mut text = String::new();
            for v in values {
                text.clear();
                if let Some(v) = v {
                    keys::write_hex(v, &mut text);
                }
                push(v.is_some().then_some(text.as_str()));
            }
        }
        other => unreachable!("{other:?} is not a string kind; classify() decides"),
    }
}

/// Writes integers as their smallest value, then each one's distance from it in the fewest
/// bytes that hold the largest (1, 2, 4 or 8, named by one byte): event ids, sensor ids, times
/// and row numbers in a bucket's piece span far less than 64 bits, and the spill held in memory
/// is the largest memory a compile touches (a byte not written is a page not faulted and a copy
/// not made, in the spill and in each pass's load).
pub(crate) fn put_narrow<T: Narrow>(out: &mut Vec<u8>, v: &[T]) {
    let min = v.iter().map(|x| x.wide()).min().unwrap_or(0);
    let max = v.iter().map(|x| x.wide()).max().unwrap_or(0);
    let width: usize = match max.wrapping_sub(min) as u64 {
        0..=0xFF => 1,
        0x100..=0xFFFF => 2,
        0x1_0000..=0xFFFF_FFFF => 4,
        _ => 8,
    };
    out.extend_from_slice(&min.to_le_bytes());
    out.push(width as u8);
    let start = out.len();
    out.resize(start + v.len() * width, 0);
    let dst = &mut out[start..];
    let off = |x: &T| x.wide().wrapping_sub(min) as u64;
    match width {
        1 => dst.iter_mut().zip(v).for_each(|(d, x)| *d = off(x) as u8),
        2 => dst
            .chunks_exact_mut(2)
            .zip(v)
            .for_each(|(d, x)| d.copy_from_slice(&(off(x) as u16).to_le_bytes())),
        4 => dst
            .chunks_exact_mut(4)
            .zip(v)
            .for_each(|(d, x)| d.copy_from_slice(&(off(x) as u32).to_le_bytes())),
        _ => dst
            .chunks_exact_mut(8)
            .zip(v)
            .for_each(|(d, x)| d.copy_from_slice(&off(x).to_le_bytes())),
    }
}

/// Reads `len` integers written by [`put_narrow`] from the front of `bytes` onto `v`.
pub(crate) fn take_narrow<T: Narrow>(bytes: &mut &[u8], len: usize, v: &mut Vec<T>) {
    let (head, rest) = bytes.split_at(9);
    let min = i64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
    let width = head[8] as usize;
    let (body, rest) = rest.split_at(len * width);
    *bytes = rest;
    let at = |x: u64| T::narrow(min.wrapping_add(x as i64));
    match width {
        1 => v.extend(body.iter().map(|&b| at(u64::from(b)))),
        2 => v.extend(
            body.chunks_exact(2)
                .map(|c| at(u64::from(u16::from_le_bytes([c[0], c[1]])))),
        ),
        4 => v.extend(body.chunks_exact(4).map(|c| {
            at(u64::from(u32::from_le_bytes(
                c.try_into().expect("4 bytes"),
            )))
        })),
        _ => v.extend(
            body.chunks_exact(8)
                .map(|c| at(u64::from_le_bytes(c.try_into().expect("8 bytes")))),
        ),
    }
}

/// The integers [`put_narrow`] writes: values and row numbers, as the same 64 bits.
pub(crate) trait Narrow: Copy {
    fn wide(self) -> i64;
    fn narrow(x: i64) -> Self;
}

impl Narrow for i64 {
    fn wide(self) -> i64 {
        self
    }
    fn narrow(x: i64) -> i64 {
        x
    }
}

impl Narrow for u64 {
    fn wide(self) -> i64 {
        self as i64
    }
    fn narrow(x: i64) -> u64 {
        x as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::Field;
    use std::sync::Arc;

    /// Messages name a type as Arrow's tools print it, never as Rust's debug form
    /// (`List(Field { name: "element", … })`).
    #[test]
    fn types_are_named_as_users_know_them() {
        let list = |dt| DataType::List(Arc::new(Field::new("element", dt, true)));
        let cases = [
            (DataType::Utf8, "string"),
            (DataType::UInt64, "uint64"),
            (DataType::Float64, "double"),
            (list(DataType::Float64), "list<double>"),
            (
                DataType::LargeList(Arc::new(Field::new("item", DataType::Utf8, true))),
                "large_list<string>",
            ),
            (DataType::FixedSizeBinary(16), "fixed_size_binary[16]"),
            (
                DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                "timestamp[ms, tz=UTC]",
            ),
            (
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                "dictionary<string>",
            ),
        ];
        for (dt, shown) in cases {
            assert_eq!(type_name(&dt), shown);
        }
        // What manifests record is unchanged.
        assert_eq!(classify(&DataType::Utf8).unwrap().name, "Utf8");
        assert_eq!(classify(&DataType::Utf8).unwrap().shown, "string");
    }

    #[test]
    fn narrow_integers_come_back_as_they_were() {
        let cases: Vec<Vec<i64>> = vec![
            vec![],
            vec![7],
            vec![-3, 250, 0],
            vec![1_000_000, 1_000_000 + 65_535],
            vec![-5, 70_000, 1 << 31],
            vec![i64::MIN, i64::MAX, 0, -1],
            (0..1000).map(|i| i * 1_000_003 - 400_000_000).collect(),
        ];
        let widths = [1, 1, 1, 2, 4, 8, 4];
        for (v, want_width) in cases.iter().zip(widths) {
            let mut out = vec![0xAB];
            put_narrow(&mut out, v);
            assert_eq!(out.len(), 1 + 9 + v.len() * want_width, "{v:?}");
            out.extend_from_slice(b"next");
            let mut bytes = &out[1..];
            let mut back = vec![42];
            take_narrow(&mut bytes, v.len(), &mut back);
            assert_eq!(&back[1..], &v[..]);
            assert_eq!(bytes, b"next", "the reader stops where the writer did");
        }
    }

    /// A bucket's pieces read back one after the other: strings keep their values whatever
    /// codes each piece's dictionary gave them, nulls stay null, plain strings keep their bytes.
    #[test]
    fn pieces_read_onto_one_column_are_the_columns_appended() {
        let info = |plain| TypeInfo {
            kind: Kind::Str,
            scale: 1.0,
            name: "Utf8".into(),
            shown: "string".into(),
            list: false,
            plain,
        };
        for plain in [false, true] {
            let pieces: Vec<ArrayRef> = vec![
                Arc::new(arrow_array::StringArray::from(vec![
                    Some("b"),
                    None,
                    Some("a"),
                ])),
                Arc::new(arrow_array::StringArray::from(vec![Some("c"), Some("a")])),
                Arc::new(arrow_array::StringArray::from(vec![None::<&str>])),
            ];
            let mut bytes = Vec::new();
            let mut want = Column::new(info(plain), 0);
            for array in &pieces {
                let mut piece = Column::new(info(plain), 0);
                piece.push_array(array);
                piece.write_to(&mut bytes);
                want.push_array(array);
            }
            let mut got = Column::new(info(plain), 0);
            let mut rest = &bytes[..];
            for _ in &pieces {
                got.read_onto(&mut rest);
            }
            assert!(rest.is_empty());
            assert_eq!(got.len, 6);
            for row in 0..6 {
                assert_eq!(got.text_bytes(row), want.text_bytes(row), "row {row}");
            }
        }
    }
}
