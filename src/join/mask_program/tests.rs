//! The program's machine against DataFusion's own evaluation of the same predicates, over
//! columns with NULLs, extreme integers and the floats that order oddly (NaN, -0.0, infinities).

use std::sync::Arc;

use arrow::array::{
    Array, BooleanArray, Date32Array, Float32Array, Float64Array, Int32Array, Int64Array,
    RecordBatch, StringArray, TimestampMillisecondArray, UInt32Array, UInt64Array,
};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::common::DFSchema;
use datafusion::prelude::SessionContext;

use super::*;

const ROWS: usize = 1000;

/// A small deterministic generator (the tests need no crate for it).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 17
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn batch() -> RecordBatch {
    let mut rng = Lcg(7);
    let id: Int64Array = (0..ROWS as i64).map(Some).collect();
    let big: Int64Array = (0..ROWS)
        .map(|i| match i % 97 {
            0 => None,
            1 => Some(i64::MAX - (i as i64)),
            2 => Some(i64::MIN + (i as i64)),
            _ => Some(rng.next() as i64 - (1 << 45)),
        })
        .collect();
    let small: Int32Array = (0..ROWS)
        .map(|i| (i % 13 != 5).then(|| (rng.below(2001) as i32) - 1000))
        .collect();
    let count: UInt32Array = (0..ROWS).map(|_| Some(rng.below(5000) as u32)).collect();
    let wide: UInt64Array = (0..ROWS)
        .map(|i| {
            Some(if i % 7 == 0 {
                u64::MAX - i as u64
            } else {
                rng.next()
            })
        })
        .collect();
    let specials = [
        f64::NAN,
        -0.0,
        0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -f64::NAN,
    ];
    let score: Float64Array = (0..ROWS)
        .map(|i| match i % 11 {
            0 => None,
            1 => Some(specials[i % specials.len()]),
            _ => Some((rng.below(20001) as f64 - 10000.0) / 100.0),
        })
        .collect();
    let weight: Float32Array = (0..ROWS)
        .map(|i| match i % 9 {
            0 => Some(f32::NAN),
            1 => Some(-0.0),
            2 => None,
            _ => Some((rng.below(2001) as f32 - 1000.0) / 8.0),
        })
        .collect();
    let deleted: BooleanArray = (0..ROWS)
        .map(|i| (i % 17 != 3).then_some(rng.below(4) == 0))
        .collect();
    let day: Date32Array = (0..ROWS)
        .map(|_| Some(19000 + rng.below(1000) as i32))
        .collect();
    let at: TimestampMillisecondArray = (0..ROWS)
        .map(|i| (i % 23 != 0).then(|| 1_700_000_000_000 + rng.below(1 << 30) as i64))
        .collect();
    let lang: StringArray = (0..ROWS).map(|i| Some(["en", "de", "fr"][i % 3])).collect();
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("big", DataType::Int64, true),
        Field::new("small", DataType::Int32, true),
        Field::new("count", DataType::UInt32, false),
        Field::new("wide", DataType::UInt64, false),
        Field::new("score", DataType::Float64, true),
        Field::new("weight", DataType::Float32, true),
        Field::new("deleted", DataType::Boolean, true),
        Field::new("day", DataType::Date32, false),
        Field::new("at", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        Field::new("lang", DataType::Utf8, false),
    ]);
    RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(id),
            Arc::new(big),
            Arc::new(small),
            Arc::new(count),
            Arc::new(wide),
            Arc::new(score),
            Arc::new(weight),
            Arc::new(deleted),
            Arc::new(day),
            Arc::new(at),
            Arc::new(lang),
        ],
    )
    .expect("the test batch")
}

/// The physical predicate of `sql` over `batch`, simplified and coerced as a query's would be.
fn physical(sql: &str, batch: &RecordBatch) -> Arc<dyn PhysicalExpr> {
    let ctx = SessionContext::new();
    let schema = DFSchema::try_from(batch.schema().as_ref().clone()).expect("a schema");
    let logical = ctx
        .parse_sql_expr(sql, &schema)
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    ctx.create_physical_expr(logical, &schema)
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// DataFusion's answer: the rows whose value is TRUE.
fn datafusion_bits(predicate: &Arc<dyn PhysicalExpr>, batch: &RecordBatch) -> Vec<bool> {
    let values = predicate
        .evaluate(batch)
        .and_then(|v| v.into_array(batch.num_rows()))
        .expect("DataFusion evaluates it");
    let values = values.as_boolean();
    (0..values.len())
        .map(|i| values.is_valid(i) && values.value(i))
        .collect()
}

fn program_bits(sql: &str, batch: &RecordBatch) -> Option<Vec<bool>> {
    let predicate = physical(sql, batch);
    let program = MaskProgram::compile(&predicate, batch.schema().as_ref())?;
    let keys = program
        .column_keys(batch)
        .expect("keys of compiled columns");
    let bits = program.evaluate_on_host(&keys, batch.num_rows());
    Some(bits.iter().collect())
}

fn assert_same(sql: &str, batch: &RecordBatch) {
    let expected = datafusion_bits(&physical(sql, batch), batch);
    let got = program_bits(sql, batch).unwrap_or_else(|| panic!("{sql}: not compiled"));
    let differ: Vec<usize> = (0..expected.len())
        .filter(|&i| expected[i] != got[i])
        .collect();
    assert!(
        differ.is_empty(),
        "{sql}: {} rows differ from DataFusion's answer, first at row {} (DataFusion {})",
        differ.len(),
        differ[0],
        expected[differ[0]]
    );
}

#[test]
fn compiled_predicates_answer_as_datafusion_does() {
    let batch = batch();
    for sql in [
        "id % 10 = 3",
        "(id + 7) % 100 = 5",
        "(id + 3) % 10000 = 6",
        "id >= 100 AND id < 250",
        "id BETWEEN 10 AND 20 OR id > 990",
        "NOT (id % 3 = 0)",
        "id IN (1, 5, 999, 4000)",
        "id NOT IN (1, 5, 999)",
        "big % 7 = 2",
        "big % -7 = -2",
        "big / 1000000 > 5",
        "big + 9223372036854775000 < 0",
        "big * 3 > big",
        "big - id < 0",
        "big IS NULL",
        "big IS NOT NULL AND big > 0",
        "small > -10",
        "small = 17 OR small IS NULL",
        "small % 4 = 1",
        "small + 1000 < count",
        "count < 2500",
        "count % 2 = 0 AND id < 500",
        "wide > 18446744073709551000",
        "wide < 9223372036854775808",
        "score > 0.5",
        "score < 0",
        "score = 0.0",
        "score >= -0.0",
        "score > 1e308",
        "score <> score",
        "weight > 10.5",
        "CAST(weight AS DOUBLE) > 1.0",
        "CAST(small AS DOUBLE) < 2.5",
        "CAST(count AS SMALLINT) > 100 OR id < 2",
        "weight <= -0.0",
        "weight = weight",
        "deleted",
        "NOT deleted",
        "deleted = false",
        "deleted IS NULL OR id < 3",
        "NOT deleted AND (score > 10 OR small < 0)",
        "day >= DATE '2022-01-01'",
        "day < DATE '2022-06-01' AND day > DATE '2022-03-01'",
        "at > TIMESTAMP '2023-11-20 00:00:00'",
        "at IS NULL",
        "small IN (1, 2, NULL)",
        "small NOT IN (1, 2, NULL)",
        "big > NULL",
        "(big > 0) OR (small > NULL)",
        "(big > 0) AND (small > NULL)",
    ] {
        assert_same(sql, &batch);
    }
}

#[test]
fn generated_modulo_and_range_filters_answer_as_datafusion_does() {
    let batch = batch();
    let mut rng = Lcg(11);
    for round in 0..300u64 {
        let column = ["id", "big", "small", "count"][rng.below(4) as usize];
        let m = [2, 3, 10, 100, 1000, 7919][rng.below(6) as usize];
        let r = rng.below(50) as i64 - 25;
        let c = rng.below(m) as i64;
        let lo = rng.below(2000) as i64 - 1000;
        let sql = match round % 4 {
            0 => format!("({column} + {r}) % {m} = {c}"),
            1 => format!(
                "{column} >= {lo} AND {column} < {}",
                lo + rng.below(500) as i64
            ),
            2 => format!("({column} * {r}) % {m} <> {c} OR {column} IS NULL"),
            _ => format!("NOT ({column} - {r} > {lo}) AND {column} % {m} IN ({c}, 1)"),
        };
        assert_same(&sql, &batch);
    }
}

#[test]
fn predicates_without_an_exact_program_are_left_to_the_host() {
    let batch = batch();
    for sql in [
        "lang = 'en'",
        "score + 1 > 2",
        "score * 2.0 > 1",
        "id % 0 = 1",
        "big % -1 = 0",
        "id % small = 1",
        "abs(big) > 5",
        "CASE WHEN id > 5 THEN true ELSE false END",
    ] {
        let predicate = physical(sql, &batch);
        assert_eq!(
            MaskProgram::compile(&predicate, batch.schema().as_ref()),
            None,
            "{sql} should be left to DataFusion"
        );
    }
}

#[test]
fn a_sliced_column_reads_its_own_rows() {
    let batch = batch().slice(37, 500);
    for sql in ["big % 7 = 2", "deleted", "small IS NULL", "score > 1"] {
        assert_same(sql, &batch);
    }
}

#[test]
fn programs_past_the_bounds_are_not_compiled() {
    let batch = batch();
    let long = (0..(MAX_OPS as i64))
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let predicate = physical(&format!("id IN ({long})"), &batch);
    assert_eq!(
        MaskProgram::compile(&predicate, batch.schema().as_ref()),
        None
    );
    let deep = (0..MAX_DEPTH + 2).fold("id".to_string(), |e, i| format!("({i} + {e})"));
    let predicate = physical(&format!("{deep} > 0"), &batch);
    // Either compiled within the bound (DataFusion folds constants) or refused: never wrong.
    if MaskProgram::compile(&predicate, batch.schema().as_ref()).is_some() {
        assert_same(&format!("{deep} > 0"), &batch);
    }
}
