//! Sample customer-transaction data: a context table with one row per customer and a rows table
//! whose rows of one customer are scattered over all files and positions, the case where grouping
//! needs more than a streaming pass.
//!
//! Targets are learnable from the sequences: `lifetime_value` is the sum of a customer's non-null
//! amounts, and customers who churned stop transacting early.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{
    ArrayRef, BooleanArray, FixedSizeBinaryArray, Float32Array, Float64Array, Int32Array,
    Int64Array, StringArray, TimestampMicrosecondArray, UInt64Array,
};
use arrow_schema::{DataType, TimeUnit};
use rayon::prelude::*;

use super::{create_dir, schema, GenError, GenSummary, ParquetSink, Rng, ROW_GROUP_ROWS};

/// Values of `segment`.
pub const SEGMENTS: [&str; 3] = ["retail", "smb", "enterprise"];
/// Values of `channel`.
pub const CHANNELS: [&str; 3] = ["web", "store", "app"];
/// Values of `merchant_category`, most frequent first (Zipf-like).
#[rustfmt::skip]
pub const CATEGORIES: [&str; 20] = [
    "grocery", "restaurants", "fuel", "online_retail", "pharmacy", "clothing", "electronics",
    "travel", "utilities", "entertainment", "home_improvement", "health", "subscriptions",
    "sporting_goods", "books", "automotive", "education", "insurance", "jewelry", "charity",
];

const SEGMENT_WEIGHTS: [f64; 3] = [0.70, 0.22, 0.08];
const CHANNEL_WEIGHTS: [f64; 3] = [0.45, 0.35, 0.20];
/// Median transaction amount per segment; customers without a segment get the last.
const MEDIAN_AMOUNT: [f64; 4] = [35.0, 120.0, 600.0, 50.0];
const TIMESTAMP: DataType = DataType::Timestamp(TimeUnit::Microsecond, None);
const MICROS_PER_YEAR: f64 = 365.25 * 86_400e6;
/// 2015-01-01T00:00:00 and 2024-07-01T00:00:00 (the data's end), in microseconds.
const START_US: i64 = 1_420_070_400_000_000;
const END_US: i64 = 1_719_792_000_000_000;

// Separate streams for the ids, the customer-table order, each customer and each file's order.
const STREAM_IDS: u64 = 0x5E0_0001;
const STREAM_TABLE_ORDER: u64 = 0x5E0_0002;
const STREAM_UUID: u64 = 0x5E0_0003;
const STREAM_FILE: u64 = 0x5E0_1000;
const STREAM_CUSTOMER: u64 = 0x5E1_0000_0000;

/// How `customer_id` is stored: the customer's number as an integer, or the identifiers
/// exported data usually holds. The same customers and transactions whatever the style.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KeyStyle {
    /// `int64`, the customer's number.
    #[default]
    Int,
    /// `string`, `C-` and the number in eight digits (`C-00101234`).
    Text,
    /// `fixed_size_binary[16]`: a UUID (version 4 layout) drawn from the customer's number.
    Uuid,
    /// `uint64`: the number past 2^63, as 64-bit hashes of identifiers are.
    UInt64,
}

impl KeyStyle {
    /// The Arrow type of `customer_id`.
    pub fn data_type(self) -> DataType {
        match self {
            KeyStyle::Int => DataType::Int64,
            KeyStyle::Text => DataType::Utf8,
            KeyStyle::Uuid => DataType::FixedSizeBinary(16),
            KeyStyle::UInt64 => DataType::UInt64,
        }
    }

    /// The customer number `id` in this style, as a user writes it (`dsc show --key`).
    pub fn spell(self, id: i64) -> String {
        match self {
            KeyStyle::Int => id.to_string(),
            KeyStyle::Text => format!("C-{id:08}"),
            KeyStyle::Uuid => dsc_format::keys::uuid_text(&uuid_of(id)),
            KeyStyle::UInt64 => ((1u64 << 63) + id as u64).to_string(),
        }
    }

    fn column(self, ids: impl Iterator<Item = i64>) -> ArrayRef {
        match self {
            KeyStyle::Int => Arc::new(Int64Array::from_iter_values(ids)),
            KeyStyle::Text => Arc::new(StringArray::from_iter_values(ids.map(|id| self.spell(id)))),
            KeyStyle::Uuid => Arc::new(
                FixedSizeBinaryArray::try_from_iter(ids.map(uuid_of)).expect("16 bytes each"),
            ),
            KeyStyle::UInt64 => Arc::new(UInt64Array::from_iter_values(
                ids.map(|id| (1u64 << 63) + id as u64),
            )),
        }
    }
}

/// A UUID for customer number `id`: 16 bytes from the number's own stream, with the version-4
/// and variant bits set as random UUIDs have them.
fn uuid_of(id: i64) -> [u8; 16] {
    let mut rng = Rng::new(id as u64, STREAM_UUID);
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&rng.next_u64().to_le_bytes());
    b[8..].copy_from_slice(&rng.next_u64().to_le_bytes());
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    b
}

/// How the transactions are laid out in files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Layout {
    /// `transactions/part-*.parquet`, one row per transaction, each customer's rows scattered
    /// over every file and position, and `customers.parquet`.
    #[default]
    Scattered,
    /// `lists/part-*.parquet`: one row per customer, its own columns and its transactions as
    /// list columns in time order (the layout of Hugging Face `datasets`); the customers in
    /// the customer table's order, cut into `files` contiguous parts.
    Lists,
    /// The `Lists` table exploded: `transactions/part-*.parquet` holding, file for file, each
    /// customer's transactions in turn in list order, and `customers.parquet` in the same
    /// customer order. What `pandas.DataFrame.explode` makes of the list table, row for row.
    Exploded,
}

/// What to generate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequencesOptions {
    /// Customers (contexts), including the ~3 % without transactions.
    pub customers: usize,
    /// Number of `transactions/part-{i:03}.parquet` files.
    pub files: usize,
    /// Seed: the same options give byte-identical files.
    pub seed: u64,
    /// How `customer_id` is stored in both tables.
    pub keys: KeyStyle,
    /// How the transactions are laid out.
    pub layout: Layout,
}

impl Default for SequencesOptions {
    fn default() -> Self {
        SequencesOptions {
            customers: 2000,
            files: 4,
            seed: 0,
            keys: KeyStyle::Int,
            layout: Layout::Scattered,
        }
    }
}

/// Writes `out/transactions/part-{i:03}.parquet` (i in `0..files`) and `out/customers.parquet`.
///
/// Each customer is simulated from its own stream of the seed, and each file keeps the
/// transactions drawn for it, in an order shuffled by the file's own stream; so memory holds one
/// file per thread, and the bytes do not depend on the thread count. The price is that every file
/// re-simulates all customers: time grows with `files × transactions`.
pub fn generate(out: &Path, opts: &SequencesOptions) -> Result<GenSummary, GenError> {
    if opts.customers == 0 || opts.files == 0 || opts.files > u32::MAX as usize {
        let reason = format!("need at least one customer and one file: {opts:?}");
        return Err(GenError::InvalidOptions { reason });
    }
    // Increasing ids with random gaps: unique, not consecutive; the table order is shuffled below.
    let mut rng = Rng::new(opts.seed, STREAM_IDS);
    let ids: Vec<i64> = (0..opts.customers)
        .scan(100_000 + rng.below(1000) as i64, |next, _| {
            let id = *next;
            *next += 1 + rng.below(997) as i64;
            Some(id)
        })
        .collect();
    let simulate = |i: usize| simulate_customer(opts.seed, i, ids[i], opts.files as u32);
    if opts.layout != Layout::Scattered {
        return by_customer(out, opts, &simulate);
    }
    let dir = out.join("transactions");
    create_dir(&dir)?;

    let parts = (0..opts.files)
        .into_par_iter()
        .map(|f| {
            let mut rows: Vec<Txn> = (0..opts.customers)
                .into_par_iter()
                .flat_map_iter(|i| simulate(i).1.into_iter().filter(|t| t.file == f as u32))
                .collect();
            Rng::new(opts.seed, STREAM_FILE + f as u64).shuffle(&mut rows);
            write_transactions(&dir.join(format!("part-{f:03}.parquet")), &rows, opts.keys)
        })
        .collect::<Result<Vec<_>, _>>()?;

    let mut customers: Vec<Customer> = (0..opts.customers)
        .into_par_iter()
        .map(|i| simulate(i).0)
        .collect();
    Rng::new(opts.seed, STREAM_TABLE_ORDER).shuffle(&mut customers);
    let mut summary = GenSummary::default();
    for (path, rows) in parts {
        summary.files.push(path);
        summary.rows += rows;
    }
    summary.contexts = customers.len() as u64;
    summary
        .files
        .push(write_customers(out, &customers, opts.keys)?);
    Ok(summary)
}

/// The `Lists` and `Exploded` layouts: the customers in the customer table's order, cut into
/// `files` parts, each customer's transactions in time order.
fn by_customer(
    out: &Path,
    opts: &SequencesOptions,
    simulate: &(dyn Fn(usize) -> (Customer, Vec<Txn>) + Sync),
) -> Result<GenSummary, GenError> {
    let mut order: Vec<usize> = (0..opts.customers).collect();
    Rng::new(opts.seed, STREAM_TABLE_ORDER).shuffle(&mut order);
    let dir = out.join(match opts.layout {
        Layout::Lists => "lists",
        _ => "transactions",
    });
    create_dir(&dir)?;
    let n = opts.customers;
    let parts = (0..opts.files)
        .into_par_iter()
        .map(|f| {
            let mine = &order[f * n / opts.files..(f + 1) * n / opts.files];
            let simulated: Vec<(Customer, Vec<Txn>)> = mine
                .par_iter()
                .map(|&i| {
                    let (c, mut txns) = simulate(i);
                    txns.sort_by_key(|t| t.ts_us);
                    (c, txns)
                })
                .collect();
            let path = dir.join(format!("part-{f:03}.parquet"));
            let rows = simulated.iter().map(|(_, t)| t.len() as u64).sum::<u64>();
            let written = match opts.layout {
                Layout::Lists => write_lists(&path, &simulated, opts.keys)?,
                _ => {
                    let txns: Vec<Txn> = simulated.iter().flat_map(|(_, t)| t.clone()).collect();
                    write_transactions(&path, &txns, opts.keys)?.0
                }
            };
            Ok((
                written,
                rows,
                simulated.into_iter().map(|(c, _)| c).collect::<Vec<_>>(),
            ))
        })
        .collect::<Result<Vec<_>, GenError>>()?;
    let mut summary = GenSummary::default();
    let mut customers = Vec::with_capacity(n);
    for (path, rows, part) in parts {
        summary.files.push(path);
        summary.rows += rows;
        customers.extend(part);
    }
    summary.contexts = customers.len() as u64;
    if opts.layout == Layout::Exploded {
        summary
            .files
            .push(write_customers(out, &customers, opts.keys)?);
    }
    Ok(summary)
}

/// One part of the `Lists` layout: a row per customer, its transactions as lists.
fn write_lists(
    path: &Path,
    customers: &[(Customer, Vec<Txn>)],
    keys: KeyStyle,
) -> Result<PathBuf, GenError> {
    use arrow_array::builder::{
        BooleanBuilder, Float32Builder, Float64Builder, Int32Builder, ListBuilder, StringBuilder,
        TimestampMicrosecondBuilder,
    };
    let list = |t: DataType| DataType::List(Arc::new(arrow_schema::Field::new("item", t, true)));
    let schema = schema(&[
        ("customer_id", keys.data_type(), false),
        ("age", DataType::Int32, true),
        ("segment", DataType::Utf8, true),
        ("tenure_years", DataType::Float32, false),
        ("churned", DataType::Boolean, false),
        ("lifetime_value", DataType::Float64, false),
        ("ts", list(TIMESTAMP), false),
        ("amount", list(DataType::Float64), false),
        ("merchant_category", list(DataType::Utf8), false),
        ("channel", list(DataType::Utf8), false),
        ("items", list(DataType::Int32), false),
        ("discount", list(DataType::Float32), false),
        ("is_refund", list(DataType::Boolean), false),
    ]);
    let mut sink = ParquetSink::create(path, schema)?;
    for part in customers.chunks(ROW_GROUP_ROWS) {
        let mut ts = ListBuilder::new(TimestampMicrosecondBuilder::new());
        let mut amount = ListBuilder::new(Float64Builder::new());
        let mut category = ListBuilder::new(StringBuilder::new());
        let mut channel = ListBuilder::new(StringBuilder::new());
        let mut items = ListBuilder::new(Int32Builder::new());
        let mut discount = ListBuilder::new(Float32Builder::new());
        let mut refund = ListBuilder::new(BooleanBuilder::new());
        for (_, txns) in part {
            for t in txns {
                ts.values().append_value(t.ts_us);
                amount.values().append_option(t.amount);
                category
                    .values()
                    .append_option(t.category.map(|c| CATEGORIES[c]));
                channel.values().append_value(CHANNELS[t.channel]);
                items.values().append_value(t.items);
                discount.values().append_value(t.discount);
                refund.values().append_value(t.is_refund);
            }
            ts.append(true);
            amount.append(true);
            category.append(true);
            channel.append(true);
            items.append(true);
            discount.append(true);
            refund.append(true);
        }
        let cs = part.iter().map(|(c, _)| c);
        sink.write(vec![
            keys.column(cs.clone().map(|c| c.id)),
            Arc::new(Int32Array::from_iter(cs.clone().map(|c| c.age))),
            Arc::new(StringArray::from_iter(
                cs.clone().map(|c| c.segment.map(|s| SEGMENTS[s])),
            )),
            Arc::new(Float32Array::from_iter_values(
                cs.clone().map(|c| c.tenure_years),
            )),
            Arc::new(BooleanArray::from_iter(cs.clone().map(|c| Some(c.churned)))),
            Arc::new(Float64Array::from_iter_values(cs.map(|c| c.lifetime_value))),
            Arc::new(ts.finish()),
            Arc::new(amount.finish()),
            Arc::new(category.finish()),
            Arc::new(channel.finish()),
            Arc::new(items.finish()),
            Arc::new(discount.finish()),
            Arc::new(refund.finish()),
        ])?;
    }
    sink.finish()
}

#[derive(Debug, Clone)]
struct Customer {
    id: i64,
    age: Option<i32>,
    segment: Option<usize>,
    signup_us: i64,
    tenure_years: f32,
    churned: bool,
    lifetime_value: f64,
}

#[derive(Debug, Clone)]
struct Txn {
    customer_id: i64,
    ts_us: i64,
    amount: Option<f64>,
    category: Option<usize>,
    channel: usize,
    items: i32,
    discount: f32,
    is_refund: bool,
    /// The part file the transaction goes to.
    file: u32,
}

/// An index drawn with probability proportional to `weights`.
fn pick(rng: &mut Rng, weights: &[f64]) -> usize {
    let mut u = rng.uniform(0.0, weights.iter().sum());
    for (i, w) in weights.iter().enumerate() {
        if u < *w {
            return i;
        }
        u -= w;
    }
    weights.len() - 1
}

/// One customer and all their transactions, from the customer's own stream.
fn simulate_customer(seed: u64, index: usize, id: i64, files: u32) -> (Customer, Vec<Txn>) {
    let rng = &mut Rng::new(seed, STREAM_CUSTOMER + index as u64);
    let age = (!rng.bernoulli(0.05)).then(|| (42.0 + 14.0 * rng.normal()).clamp(18.0, 90.0) as i32);
    let segment = (!rng.bernoulli(0.02)).then(|| pick(rng, &SEGMENT_WEIGHTS));
    let signup_us = rng.uniform(START_US as f64, (END_US - 30 * 86_400_000_000) as f64) as i64;
    let tenure_years = (END_US - signup_us) as f64 / MICROS_PER_YEAR;
    let silent = rng.bernoulli(0.03);
    // Churn is likelier for young, retail and recent customers and for those who never buy; a
    // churned customer's activity stops at a random point, so recency predicts the label.
    let on = |b: bool| f64::from(u8::from(b));
    let (retail, young) = (segment == Some(0), age.is_some_and(|a| a < 30));
    let logit = -1.0 + 0.8 * on(retail) + 0.3 * on(young) + 1.5 * on(silent) - 0.15 * tenure_years;
    let churned = rng.bernoulli(1.0 / (1.0 + (-logit).exp()));
    let stop = rng.uniform(signup_us as f64, END_US as f64);
    let active_until = if churned { stop } else { END_US as f64 };
    let n = rng.lognormal(20.0, 1.0).round().clamp(1.0, 5000.0) as usize * usize::from(!silent);

    let median = MEDIAN_AMOUNT[segment.unwrap_or(3)];
    let zipf: Vec<f64> = (0..CATEGORIES.len())
        .map(|k| (k as f64 + 1.0).powf(-1.1))
        .collect();
    let favourite = pick(rng, &zipf);
    let mut lifetime_value = 0.0;
    let txns = (0..n)
        .map(|_| {
            let is_refund = rng.bernoulli(0.04);
            let value = (rng.lognormal(median, 0.8) * 100.0).round() / 100.0;
            let amount = (!rng.bernoulli(0.01)).then_some(if is_refund { -value } else { value });
            lifetime_value += amount.unwrap_or(0.0);
            let category = match rng.unit_f64() {
                u if u < 0.02 => None,
                u if u < 0.35 => Some(favourite),
                _ => Some(pick(rng, &zipf)),
            };
            // 30 % of transactions get a discount of 5 % to 50 %.
            let tier = u64::from(rng.bernoulli(0.3)) * (1 + rng.below(10));
            Txn {
                customer_id: id,
                ts_us: rng.uniform(signup_us as f64, active_until) as i64,
                amount,
                category,
                channel: pick(rng, &CHANNEL_WEIGHTS),
                items: 1 + rng.exponential(1.5) as i32,
                discount: (tier as f64 * 0.05) as f32,
                is_refund,
                file: rng.below(u64::from(files)) as u32,
            }
        })
        .collect();
    let customer = Customer {
        id,
        age,
        segment,
        signup_us,
        tenure_years: tenure_years as f32,
        churned,
        lifetime_value: (lifetime_value * 100.0).round() / 100.0,
    };
    (customer, txns)
}

fn timestamp(values: impl Iterator<Item = i64>) -> ArrayRef {
    Arc::new(TimestampMicrosecondArray::from_iter_values(values))
}

fn write_transactions(
    path: &Path,
    rows: &[Txn],
    keys: KeyStyle,
) -> Result<(PathBuf, u64), GenError> {
    let schema = schema(&[
        ("customer_id", keys.data_type(), false),
        ("ts", TIMESTAMP, false),
        ("amount", DataType::Float64, true),
        ("merchant_category", DataType::Utf8, true),
        ("channel", DataType::Utf8, false),
        ("items", DataType::Int32, false),
        ("discount", DataType::Float32, false),
        ("is_refund", DataType::Boolean, false),
    ]);
    let mut sink = ParquetSink::create(path, schema)?;
    for rows in rows.chunks(ROW_GROUP_ROWS) {
        sink.write(vec![
            keys.column(rows.iter().map(|t| t.customer_id)),
            timestamp(rows.iter().map(|t| t.ts_us)),
            Arc::new(Float64Array::from_iter(rows.iter().map(|t| t.amount))),
            Arc::new(StringArray::from_iter(
                rows.iter().map(|t| t.category.map(|c| CATEGORIES[c])),
            )),
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|t| CHANNELS[t.channel]),
            )),
            Arc::new(Int32Array::from_iter_values(rows.iter().map(|t| t.items))),
            Arc::new(Float32Array::from_iter_values(
                rows.iter().map(|t| t.discount),
            )),
            Arc::new(BooleanArray::from_iter(
                rows.iter().map(|t| Some(t.is_refund)),
            )),
        ])?;
    }
    Ok((sink.finish()?, rows.len() as u64))
}

fn write_customers(
    out: &Path,
    customers: &[Customer],
    keys: KeyStyle,
) -> Result<PathBuf, GenError> {
    let schema = schema(&[
        ("customer_id", keys.data_type(), false),
        ("age", DataType::Int32, true),
        ("segment", DataType::Utf8, true),
        ("signup", TIMESTAMP, false),
        ("tenure_years", DataType::Float32, false),
        ("churned", DataType::Boolean, false),
        ("lifetime_value", DataType::Float64, false),
    ]);
    let mut sink = ParquetSink::create(&out.join("customers.parquet"), schema)?;
    for cs in customers.chunks(ROW_GROUP_ROWS) {
        sink.write(vec![
            keys.column(cs.iter().map(|c| c.id)),
            Arc::new(Int32Array::from_iter(cs.iter().map(|c| c.age))),
            Arc::new(StringArray::from_iter(
                cs.iter().map(|c| c.segment.map(|s| SEGMENTS[s])),
            )),
            timestamp(cs.iter().map(|c| c.signup_us)),
            Arc::new(Float32Array::from_iter_values(
                cs.iter().map(|c| c.tenure_years),
            )),
            Arc::new(BooleanArray::from_iter(cs.iter().map(|c| Some(c.churned)))),
            Arc::new(Float64Array::from_iter_values(
                cs.iter().map(|c| c.lifetime_value),
            )),
        ])?;
    }
    sink.finish()
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use arrow_array::types::{Float64Type, Int32Type, TimestampMicrosecondType as Micros};

    use super::super::test_support::{run, Table};
    use super::*;

    #[test]
    fn same_seed_gives_identical_bytes_whatever_the_threads() {
        let opts = |seed| SequencesOptions {
            customers: 300,
            files: 3,
            seed,
            ..Default::default()
        };
        let files = |seed, threads| run(threads, |dir| generate(dir, &opts(seed)));
        let a = files(1, 2);
        assert_eq!(a, files(1, 1));
        assert_eq!(a.len(), 4);
        for (x, y) in a.iter().zip(&files(2, 2)) {
            assert_eq!(x.0, y.0);
            assert_ne!(x.1, y.1, "{:?}", x.0);
        }
    }

    /// Asserts that the share of nulls in `v` lies in `range`.
    fn nulls<T>(v: &[Option<T>], range: std::ops::Range<f64>) {
        let share = v.iter().filter(|x| x.is_none()).count() as f64 / v.len() as f64;
        assert!(range.contains(&share), "{share} not in {range:?}");
    }

    #[test]
    fn files_satisfy_the_documented_invariants() {
        let dir = tempfile::tempdir().unwrap();
        let opts = SequencesOptions::default();
        let summary = generate(dir.path(), &opts).unwrap();
        let cust = Table::read(&dir.path().join("customers.parquet"));
        let ids = cust.i64s("customer_id");
        assert_eq!(summary.contexts, ids.len() as u64);
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert!(
            sorted.windows(2).all(|w| w[0] < w[1]) && sorted != ids,
            "unique, shuffled"
        );
        assert!(
            sorted.windows(2).any(|w| w[1] - w[0] > 1),
            "not consecutive"
        );
        nulls(&cust.opt::<Int32Type>("age"), 0.03..0.07);
        let segments = cust.strs("segment");
        nulls(&segments, 0.008..0.035);
        assert!(segments
            .iter()
            .flatten()
            .all(|s| SEGMENTS.contains(&s.as_str())));
        assert_eq!(cust.dtype("signup"), TIMESTAMP);

        let (mut keys, mut ts) = (Vec::<i64>::new(), Vec::<i64>::new());
        let (mut file, mut refund, mut adjacent) = (Vec::<usize>::new(), Vec::<bool>::new(), 0);
        let (mut amount, mut category) = (Vec::<Option<f64>>::new(), Vec::<Option<String>>::new());
        for f in 0..opts.files {
            let t = Table::read(&dir.path().join(format!("transactions/part-{f:03}.parquet")));
            assert_eq!(
                (t.dtype("ts"), t.dtype("channel")),
                (TIMESTAMP, DataType::Utf8)
            );
            let k = t.i64s("customer_id");
            adjacent += k.windows(2).filter(|w| w[0] == w[1]).count();
            file.extend(std::iter::repeat_n(f, k.len()));
            keys.extend(k);
            ts.extend(t.col::<Micros>("ts"));
            amount.extend(t.opt::<Float64Type>("amount"));
            category.extend(t.strs("merchant_category"));
            refund.extend(t.bools("is_refund"));
            let channels = t.strs("channel");
            assert!(channels
                .iter()
                .all(|c| CHANNELS.contains(&c.as_deref().unwrap())));
        }
        assert_eq!(keys.len() as u64, summary.rows);
        assert!(
            adjacent * 20 < keys.len(),
            "a customer's rows are not contiguous: {adjacent}"
        );
        nulls(&amount, 0.005..0.016);
        nulls(&category, 0.012..0.03);
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for c in category.iter().flatten().map(String::as_str) {
            *counts.entry(c).or_default() += 1;
        }
        let mut counts: Vec<usize> = counts.into_values().collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        assert!(
            counts.len() == CATEGORIES.len() && counts[0] > 3 * counts[9],
            "{counts:?}"
        );

        let signup: HashMap<i64, i64> = ids
            .iter()
            .copied()
            .zip(cust.col::<Micros>("signup"))
            .collect();
        let mut files_of: HashMap<i64, HashSet<usize>> = HashMap::new();
        let (mut ltv, mut last_ts) = (HashMap::<i64, f64>::new(), HashMap::<i64, i64>::new());
        for (i, &k) in keys.iter().enumerate() {
            files_of.entry(k).or_default().insert(file[i]);
            assert!(ts[i] >= signup[&k] && ts[i] <= END_US);
            *ltv.entry(k).or_default() += amount[i].unwrap_or(0.0);
            let last = last_ts.entry(k).or_default();
            *last = (*last).max(ts[i]);
            assert!(amount[i].is_none_or(|a| (a < 0.0) == refund[i]));
        }
        let silent = ids.len() - files_of.len();
        assert!(
            (20..120).contains(&silent),
            "{silent} customers without transactions"
        );
        let spread = files_of.values().filter(|f| f.len() >= 2).count();
        assert!(
            spread * 10 > files_of.len() * 8,
            "{spread} customers span files"
        );

        let (churned, value) = (cust.bools("churned"), cust.f64s("lifetime_value"));
        let mut recency = [(0.0, 0); 2];
        for (i, k) in ids.iter().enumerate() {
            let sum = ltv.get(k).copied().unwrap_or(0.0);
            assert!((sum - value[i]).abs() < 0.01, "{sum} vs {}", value[i]);
            if let Some(&t) = last_ts.get(k) {
                let r = &mut recency[usize::from(churned[i])];
                *r = (r.0 + (END_US - t) as f64 / MICROS_PER_YEAR, r.1 + 1);
            }
        }
        let mean = recency.map(|(s, n)| s / n as f64);
        assert!(
            mean[1] > 2.0 * mean[0],
            "churned customers go quiet: {mean:?}"
        );
    }
}
