//! Serialisation of this crate's plan nodes for Apache Ballista: the logical `KnnJoin` /
//! `RadiusJoin` node, the physical `KnnJoinExec` / `RadiusJoinExec`, `GatherExec` and the sharded
//! join of `right_shards`, the scalar functions, and in-memory tables (`CREATE TABLE ... AS` results).
//!
//! A join's options travel as the text they were parsed from ([`OptionsSource`]: the session's
//! `sparse_knn.*` settings, then the options strings), parsed again on the other side by the
//! same parsers, so an option added to `src/options.rs` needs no change here. The encoder checks
//! that the text gives back the same options and refuses to send a plan that would not.
//!
//! Every buffer starts with one tag byte: [`OURS`] for a node of this crate (JSON follows), or
//! [`INNER`] for anything else, handed to Ballista's own codec (its shuffle operators, file
//! formats), which this one wraps.

use std::io::Cursor;
use std::sync::Arc;

use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use datafusion::catalog::TableProvider;
use datafusion::common::{internal_err, DataFusionError, Result, TableReference};
use datafusion::datasource::MemTable;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Extension, LogicalPlan, ScalarUDF};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use serde_json::{json, Value};

use crate::planner::{
    resolve_device, GatherExec, JoinKind, JoinSpec, OptionsSource, ShardedJoinExec, SparseJoinExec,
    SparseJoinNode, NEIGHBOR_PREFIX, QUERY_PREFIX,
};

/// Tag of a buffer written by this codec.
const OURS: u8 = 0x53;
/// Tag of a buffer written by the wrapped Ballista codec.
const INNER: u8 = 0x42;
/// What a scalar function of this crate is encoded as (decoded by name).
const UDF_MARK: &[u8] = b"sparse_knn";

fn codec_err(what: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Internal(format!("sparse-knn codec: {what}"))
}

fn split_tag(buf: &[u8]) -> Result<(u8, &[u8])> {
    match buf.split_first() {
        Some((tag, rest)) if *tag == OURS || *tag == INNER => Ok((*tag, rest)),
        _ => Err(codec_err(
            "a plan node from another codec (is every process of the cluster a sparse-knn one?)",
        )),
    }
}

fn write_json(value: &Value, buf: &mut Vec<u8>) -> Result<()> {
    buf.push(OURS);
    serde_json::to_writer(buf, value).map_err(codec_err)
}

fn read_json(buf: &[u8]) -> Result<Value> {
    serde_json::from_slice(buf).map_err(codec_err)
}

fn field<'a>(value: &'a Value, key: &str) -> Result<&'a Value> {
    value
        .get(key)
        .ok_or_else(|| codec_err(format!("missing field '{key}'")))
}

fn text_field(value: &Value, key: &str) -> Result<String> {
    field(value, key)?
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| codec_err(format!("field '{key}' is not text")))
}

fn u64_field(value: &Value, key: &str) -> Result<u64> {
    field(value, key)?
        .as_u64()
        .ok_or_else(|| codec_err(format!("field '{key}' is not a whole number")))
}

/// A join spec as JSON: kind, metric name and the options' source text.
pub fn spec_to_json(spec: &JoinSpec) -> Result<Value> {
    // The text must give back these very options, or the remote side would run another join.
    let again = JoinSpec::parse(spec.kind, spec.metric.name(), spec.source.clone())?;
    if again.options != spec.options || again.metric != spec.metric {
        return internal_err!(
            "{}: its options cannot be sent to the cluster: they were not built from \
             text (settings {:?}, options strings {:?} give {:?}, not {:?})",
            spec.function_name(),
            spec.source.settings,
            spec.source.texts,
            again.options,
            spec.options
        );
    }
    let (kind, amount) = match spec.kind {
        JoinKind::Knn { k } => ("knn", k as u64),
        // As bits: a decimal text round trip of a float is not guaranteed exact.
        JoinKind::Radius { radius } => ("radius", radius.to_bits()),
    };
    Ok(json!({
        "kind": kind,
        "amount": amount,
        "metric": spec.metric.name(),
        "settings": spec.source.settings,
        "texts": spec.source.texts,
    }))
}

/// The join spec of [`spec_to_json`], parsed again.
pub fn spec_from_json(value: &Value) -> Result<JoinSpec> {
    let amount = u64_field(value, "amount")?;
    let kind = match text_field(value, "kind")?.as_str() {
        "knn" => JoinKind::Knn {
            k: usize::try_from(amount).map_err(codec_err)?,
        },
        "radius" => JoinKind::Radius {
            radius: f64::from_bits(amount),
        },
        other => return Err(codec_err(format!("unknown join kind '{other}'"))),
    };
    let settings: Vec<(String, String)> =
        serde_json::from_value(field(value, "settings")?.clone()).map_err(codec_err)?;
    let texts: Vec<String> =
        serde_json::from_value(field(value, "texts")?.clone()).map_err(codec_err)?;
    JoinSpec::parse(
        kind,
        &text_field(value, "metric")?,
        OptionsSource { settings, texts },
    )
}

fn our_udf(name: &str) -> Option<Arc<ScalarUDF>> {
    crate::udf::functions()
        .into_iter()
        .find(|f| f.name() == name || f.aliases().iter().any(|a| a == name))
}

fn encode_udf(node: &ScalarUDF, buf: &mut Vec<u8>) -> bool {
    if our_udf(node.name()).is_some() {
        buf.extend_from_slice(UDF_MARK);
        true
    } else {
        false
    }
}

fn decode_udf(name: &str, buf: &[u8]) -> Option<Arc<ScalarUDF>> {
    (buf == UDF_MARK).then(|| our_udf(name)).flatten()
}

/// The logical codec: the join node and in-memory tables; the rest goes to Ballista's codec.
#[derive(Debug, Default)]
pub struct SparseKnnLogicalCodec {
    inner: BallistaLogicalExtensionCodec,
}

impl LogicalExtensionCodec for SparseKnnLogicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[LogicalPlan],
        ctx: &TaskContext,
    ) -> Result<Extension> {
        let (tag, rest) = split_tag(buf)?;
        if tag == INNER {
            return self.inner.try_decode(rest, inputs, ctx);
        }
        let value = read_json(rest)?;
        let [left, right] = inputs else {
            return Err(codec_err(format!(
                "a join node has two inputs, got {}",
                inputs.len()
            )));
        };
        let node = SparseJoinNode::from_parts(
            Arc::new(spec_from_json(field(&value, "spec")?)?),
            left.clone(),
            right.clone(),
            text_field(&value, "left_vector")?,
            text_field(&value, "right_vector")?,
        )?;
        Ok(Extension {
            node: Arc::new(node),
        })
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> Result<()> {
        match node.node.as_any().downcast_ref::<SparseJoinNode>() {
            Some(join) => write_json(
                &json!({
                    "spec": spec_to_json(&join.spec)?,
                    "left_vector": join.left_vector,
                    "right_vector": join.right_vector,
                }),
                buf,
            ),
            None => {
                buf.push(INNER);
                self.inner.try_encode(node, buf)
            }
        }
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: arrow::datatypes::SchemaRef,
        ctx: &TaskContext,
    ) -> Result<Arc<dyn TableProvider>> {
        let (tag, rest) = split_tag(buf)?;
        if tag == INNER {
            return self
                .inner
                .try_decode_table_provider(rest, table_ref, schema, ctx);
        }
        let partitions = read_partitions(rest)?;
        Ok(Arc::new(MemTable::try_new(schema, partitions)?))
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        match node.downcast_ref::<MemTable>() {
            // A table made by CREATE TABLE ... AS (or registered from batches) lives in the
            // client's memory: its rows travel inside the plan, as Arrow IPC.
            Some(table) => {
                buf.push(OURS);
                write_partitions(table, buf)
            }
            None => {
                buf.push(INNER);
                self.inner.try_encode_table_provider(table_ref, node, buf)
            }
        }
    }

    fn try_decode_file_format(
        &self,
        buf: &[u8],
        ctx: &TaskContext,
    ) -> Result<Arc<dyn datafusion::datasource::file_format::FileFormatFactory>> {
        self.inner.try_decode_file_format(buf, ctx)
    }

    fn try_encode_file_format(
        &self,
        buf: &mut Vec<u8>,
        node: Arc<dyn datafusion::datasource::file_format::FileFormatFactory>,
    ) -> Result<()> {
        self.inner.try_encode_file_format(buf, node)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        match decode_udf(name, buf) {
            Some(f) => Ok(f),
            None => self.inner.try_decode_udf(name, buf),
        }
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        if encode_udf(node, buf) {
            Ok(())
        } else {
            self.inner.try_encode_udf(node, buf)
        }
    }
}

/// Partitions of a `MemTable` as: partition count, then per partition its IPC stream's length
/// and bytes.
fn write_partitions(table: &MemTable, buf: &mut Vec<u8>) -> Result<()> {
    let schema = table.schema();
    buf.extend_from_slice(&(table.batches.len() as u64).to_le_bytes());
    for partition in &table.batches {
        let batches = partition
            .try_read()
            .map_err(|_| codec_err("an in-memory table is being written to"))?
            .clone();
        let mut bytes = Vec::new();
        {
            let mut writer = StreamWriter::try_new(&mut bytes, &schema)?;
            for batch in &batches {
                writer.write(batch)?;
            }
            writer.finish()?;
        }
        buf.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        buf.extend_from_slice(&bytes);
    }
    Ok(())
}

fn read_partitions(mut buf: &[u8]) -> Result<Vec<Vec<RecordBatch>>> {
    fn take_u64(buf: &mut &[u8]) -> Result<u64> {
        if buf.len() < 8 {
            return Err(codec_err("truncated in-memory table"));
        }
        let (head, rest) = buf.split_at(8);
        *buf = rest;
        Ok(u64::from_le_bytes(head.try_into().expect("8 bytes")))
    }
    let count = take_u64(&mut buf)?;
    let mut partitions = Vec::new();
    for _ in 0..count {
        let len = usize::try_from(take_u64(&mut buf)?).map_err(codec_err)?;
        if buf.len() < len {
            return Err(codec_err("truncated in-memory table"));
        }
        let (bytes, rest) = buf.split_at(len);
        buf = rest;
        let reader = StreamReader::try_new(Cursor::new(bytes), None)?;
        partitions.push(reader.collect::<std::result::Result<Vec<_>, _>>()?);
    }
    Ok(partitions)
}

/// The physical codec: the join operators and the shard operators; the rest goes to Ballista's
/// codec.
#[derive(Debug, Default)]
pub struct SparseKnnPhysicalCodec {
    inner: BallistaPhysicalExtensionCodec,
}

/// The name of an input's vector column: the one input column that the output does not copy
/// (every other column `c` is copied as `<prefix>c`).
fn vector_column(
    exec: &SparseJoinExec,
    input: &Arc<dyn ExecutionPlan>,
    prefix: &str,
) -> Result<String> {
    let output = exec.schema();
    let missing: Vec<String> = input
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|name| output.field_with_name(&format!("{prefix}{name}")).is_err())
        .collect();
    match missing.as_slice() {
        [one] => Ok(one.clone()),
        _ => internal_err!("sparse-knn codec: cannot tell the vector column among {missing:?}"),
    }
}

impl PhysicalExtensionCodec for SparseKnnPhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let (tag, rest) = split_tag(buf)?;
        if tag == INNER {
            return self.inner.try_decode(rest, inputs, ctx, proto_converter);
        }
        let value = read_json(rest)?;
        let input = |i: usize| {
            inputs.get(i).cloned().ok_or_else(|| {
                codec_err(format!(
                    "operator has {} inputs, wanted {}",
                    inputs.len(),
                    i + 1
                ))
            })
        };
        match text_field(&value, "node")?.as_str() {
            "join" => {
                let spec = Arc::new(spec_from_json(field(&value, "spec")?)?);
                // `device` is resolved again where the operator runs: `auto` takes this
                // executor's GPU when it has one, whatever the scheduler has.
                let device = resolve_device(spec.function_name(), spec.options.device)?;
                // A filtered right side over a kept index: its mask plan is the third input.
                let masked = value.get("masked").and_then(|v| v.as_bool()) == Some(true);
                let mask = if masked { Some(input(2)?) } else { None };
                Ok(Arc::new(SparseJoinExec::try_new_masked(
                    spec,
                    device,
                    input(0)?,
                    input(1)?,
                    mask,
                    &text_field(&value, "left_vector")?,
                    &text_field(&value, "right_vector")?,
                )?))
            }
            "gather" => Ok(Arc::new(GatherExec::new(input(0)?))),
            "sharded_join" => {
                let spec = Arc::new(spec_from_json(field(&value, "spec")?)?);
                let device = resolve_device(spec.function_name(), spec.options.device)?;
                Ok(Arc::new(ShardedJoinExec::try_new(
                    spec,
                    device,
                    input(0)?,
                    input(1)?,
                    text_field(&value, "left_vector")?,
                    text_field(&value, "right_vector")?,
                )?))
            }
            other => Err(codec_err(format!("unknown operator '{other}'"))),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let value = if let Some(join) = node.downcast_ref::<SparseJoinExec>() {
            json!({
                "node": "join",
                "spec": spec_to_json(join.spec())?,
                "left_vector": vector_column(join, join.left(), QUERY_PREFIX)?,
                "right_vector": vector_column(join, join.right(), NEIGHBOR_PREFIX)?,
                "masked": join.right_mask().is_some(),
            })
        } else if node.downcast_ref::<GatherExec>().is_some() {
            json!({ "node": "gather" })
        } else if let Some(exec) = node.downcast_ref::<ShardedJoinExec>() {
            let (left_vector, right_vector) = exec.vectors();
            json!({
                "node": "sharded_join",
                "spec": spec_to_json(exec.spec())?,
                "left_vector": left_vector,
                "right_vector": right_vector,
            })
        } else {
            buf.push(INNER);
            return self.inner.try_encode(node, buf, proto_converter);
        };
        write_json(&value, buf)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        match decode_udf(name, buf) {
            Some(f) => Ok(f),
            None => self.inner.try_decode_udf(name, buf),
        }
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        if encode_udf(node, buf) {
            Ok(())
        } else {
            self.inner.try_encode_udf(node, buf)
        }
    }
}
