//! Zone maps of a kept side's other columns: each column's least and greatest value in every run
//! of [`ZONE_ROWS`] rows, so that a predicate over the kept columns (a right side's filter, a
//! lookup by key) is evaluated only over the runs it may pass, as a Parquet reader skips the row
//! groups its statistics rule out. A range on a column that follows the row order
//! (`id BETWEEN a AND b`, a date, a tenant written in turn) then reads a few runs of 11M rows.
//!
//! Pruning is only ever conservative: a run is skipped where DataFusion's `PruningPredicate`
//! proves no row of it passes, so the rows that pass are the same, evaluated or not. Columns
//! whose order DataFusion's comparisons and a least/greatest value might disagree on (floats:
//! NaN sorts above every number) keep no zones, and a predicate over them prunes nothing.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::pruning::PruningStatistics;
use datafusion::common::{Column, Result, ScalarValue};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::pruning::PruningPredicateBuilder;
use datafusion_functions_aggregate_common::min_max::{max_batch, min_batch};
use rayon::prelude::*;

/// Rows a zone covers, and a predicate's slice (`planner::exec::kept_left`): 8K rows make a
/// 64-bit column's intermediate 64 KB, which stays in a core's cache.
pub(crate) const ZONE_ROWS: usize = 1 << 13;

/// Each kept column's least and greatest value per zone (None: a column that keeps no zones).
pub(crate) struct Zones {
    schema: SchemaRef,
    mins: Vec<Option<ArrayRef>>,
    maxs: Vec<Option<ArrayRef>>,
    rows: ArrayRef,
    zones: usize,
}

impl Zones {
    /// The zones of `others` (a pass over its zoned columns, a zone per core at a time).
    pub(crate) fn of(others: &RecordBatch) -> Result<Zones> {
        let rows = others.num_rows();
        let zones = rows.div_ceil(ZONE_ROWS);
        let mut mins = Vec::with_capacity(others.num_columns());
        let mut maxs = Vec::with_capacity(others.num_columns());
        for column in others.columns() {
            if !zoned(column.data_type()) {
                mins.push(None);
                maxs.push(None);
                continue;
            }
            let bounds: Vec<(ScalarValue, ScalarValue)> = (0..zones)
                .into_par_iter()
                .map(|z| {
                    let start = z * ZONE_ROWS;
                    let piece = column.slice(start, ZONE_ROWS.min(rows - start));
                    Ok((min_batch(&piece)?, max_batch(&piece)?))
                })
                .collect::<Result<_>>()?;
            let (low, high): (Vec<_>, Vec<_>) = bounds.into_iter().unzip();
            mins.push(Some(column_of(low, column.data_type())?));
            maxs.push(Some(column_of(high, column.data_type())?));
        }
        let rows = Arc::new(UInt64Array::from_iter_values(
            (0..zones).map(|z| ZONE_ROWS.min(rows - z * ZONE_ROWS) as u64),
        ));
        Ok(Zones {
            schema: others.schema(),
            mins,
            maxs,
            rows,
            zones,
        })
    }

    /// Whether each zone may hold a row `predicate` (over the zoned batch's columns) passes;
    /// None where the zones rule nothing out (no zone skipped).
    pub(crate) fn may_pass(&self, predicate: &Arc<dyn PhysicalExpr>) -> Option<Vec<bool>> {
        let pruning = PruningPredicateBuilder::new()
            .with_file_schema(Arc::clone(&self.schema))
            .try_build(Arc::clone(predicate))
            .ok()?;
        if pruning.always_true() {
            return None;
        }
        let keep = pruning.prune(self).ok()?;
        (keep.len() == self.zones && keep.iter().any(|&k| !k)).then_some(keep)
    }

    pub(crate) fn memory_size(&self) -> usize {
        self.mins
            .iter()
            .chain(&self.maxs)
            .flatten()
            .map(|a| a.get_array_memory_size())
            .sum::<usize>()
            + self.rows.get_array_memory_size()
    }

    fn at(&self, column: &Column) -> Option<usize> {
        self.schema.index_of(&column.name).ok()
    }
}

/// Types whose least and greatest value bound every row the comparisons pass.
fn zoned(data_type: &DataType) -> bool {
    data_type.is_integer()
        || matches!(
            data_type,
            DataType::Date32
                | DataType::Date64
                | DataType::Timestamp(..)
                | DataType::Decimal128(..)
                | DataType::Decimal256(..)
                | DataType::Utf8
                | DataType::LargeUtf8
                | DataType::Utf8View
        )
}

fn column_of(values: Vec<ScalarValue>, data_type: &DataType) -> Result<ArrayRef> {
    if values.is_empty() {
        return Ok(arrow::array::new_empty_array(data_type));
    }
    ScalarValue::iter_to_array(values)
}

impl PruningStatistics for Zones {
    fn min_values(&self, column: &Column) -> Option<ArrayRef> {
        self.mins[self.at(column)?].clone()
    }

    fn max_values(&self, column: &Column) -> Option<ArrayRef> {
        self.maxs[self.at(column)?].clone()
    }

    fn num_containers(&self) -> usize {
        self.zones
    }

    /// Not kept: a predicate on NULLs (`IS NULL`) prunes nothing.
    fn null_counts(&self, _column: &Column) -> Option<ArrayRef> {
        None
    }

    fn row_counts(&self) -> Option<ArrayRef> {
        Some(Arc::clone(&self.rows))
    }

    fn contained(&self, _column: &Column, _values: &HashSet<ScalarValue>) -> Option<BooleanArray> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, Int64Array, StringArray};
    use arrow::datatypes::{Field, Schema};
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{binary, col, lit};

    fn batch(rows: usize) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("score", DataType::Float64, true),
            Field::new("tenant", DataType::Utf8, true),
        ]));
        // A NULL id in the zone of rows 8192.., NaN scores everywhere the id is odd.
        let id = Int64Array::from_iter((0..rows as i64).map(|i| (i != 8200).then_some(i)));
        let score = Float64Array::from_iter_values((0..rows).map(|i| {
            if i % 2 == 1 {
                f64::NAN
            } else {
                i as f64
            }
        }));
        let tenant =
            StringArray::from_iter_values((0..rows).map(|i| format!("t{:03}", i / 10_000)));
        RecordBatch::try_new(
            schema,
            vec![Arc::new(id), Arc::new(score), Arc::new(tenant)],
        )
        .unwrap()
    }

    fn predicate(
        batch: &RecordBatch,
        column: &str,
        op: Operator,
        value: ScalarValue,
    ) -> Arc<dyn PhysicalExpr> {
        let schema = batch.schema();
        binary(col(column, &schema).unwrap(), op, lit(value), &schema).unwrap()
    }

    /// Every zone a row passes in is kept, whatever the zones skip.
    fn keeps_every_passing_row(batch: &RecordBatch, zones: &Zones, p: &Arc<dyn PhysicalExpr>) {
        let pass = p
            .evaluate(batch)
            .unwrap()
            .into_array(batch.num_rows())
            .unwrap();
        let pass = pass.as_any().downcast_ref::<BooleanArray>().unwrap();
        let keep = zones.may_pass(p).unwrap_or_else(|| vec![true; zones.zones]);
        for row in 0..batch.num_rows() {
            if pass.is_valid(row) && pass.value(row) {
                assert!(
                    keep[row / ZONE_ROWS],
                    "{p}: row {row} passes in a skipped zone"
                );
            }
        }
    }

    #[test]
    fn a_range_on_an_ordered_column_skips_the_zones_outside_it() {
        let rows = 100_000;
        let b = batch(rows);
        let zones = Zones::of(&b).unwrap();
        assert_eq!(zones.zones, rows.div_ceil(ZONE_ROWS));
        let p = predicate(&b, "id", Operator::Lt, ScalarValue::Int64(Some(9000)));
        let keep = zones.may_pass(&p).expect("some zones skipped");
        assert_eq!(
            keep.iter().filter(|&&k| k).count(),
            2,
            "rows 0..9000 are in 2 zones"
        );
        keeps_every_passing_row(&b, &zones, &p);
        let p = predicate(&b, "tenant", Operator::Eq, ScalarValue::from("t005"));
        let keep = zones.may_pass(&p).expect("some zones skipped");
        assert!(keep.iter().filter(|&&k| k).count() <= 3);
        keeps_every_passing_row(&b, &zones, &p);
        // Past every row: every zone skipped.
        let p = predicate(
            &b,
            "id",
            Operator::Gt,
            ScalarValue::Int64(Some(rows as i64)),
        );
        assert!(zones.may_pass(&p).unwrap().iter().all(|&k| !k));
    }

    #[test]
    fn floats_and_predicates_zones_cannot_bound_skip_nothing() {
        let b = batch(50_000);
        let zones = Zones::of(&b).unwrap();
        // NaN > 1e9 is true in DataFusion's order: no zone may be skipped on a float column.
        let p = predicate(&b, "score", Operator::Gt, ScalarValue::Float64(Some(1e9)));
        assert!(zones.may_pass(&p).is_none());
        keeps_every_passing_row(&b, &zones, &p);
        // A modulo is no range of its column.
        let schema = b.schema();
        let modulo = binary(
            binary(
                col("id", &schema).unwrap(),
                Operator::Modulo,
                lit(7i64),
                &schema,
            )
            .unwrap(),
            Operator::Eq,
            lit(3i64),
            &schema,
        )
        .unwrap();
        assert!(zones.may_pass(&modulo).is_none());
        // The zone with a NULL id still bounds its other rows.
        let p = predicate(&b, "id", Operator::Eq, ScalarValue::Int64(Some(8201)));
        let keep = zones.may_pass(&p).unwrap();
        assert_eq!(keep.iter().filter(|&&k| k).count(), 1);
        keeps_every_passing_row(&b, &zones, &p);
    }
}
