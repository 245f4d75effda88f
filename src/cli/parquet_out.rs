//! A local Parquet file whose row groups are encoded on several threads at once and appended in
//! order. `knn` receives a probe's pairs all at once (64K left rows make 655K pairs at k = 10):
//! encoded on the receiving task, the last probe's ten row groups took 0.1 s after the last
//! kernel; here they are encoded side by side.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::mpsc::{channel, Receiver};

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use parquet::arrow::arrow_writer::{
    compute_leaves, ArrowColumnChunk, ArrowColumnWriter, ArrowRowGroupWriterFactory,
};
use parquet::arrow::ArrowWriter;
use parquet::errors::{ParquetError, Result};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;

type Encoded = Result<Vec<ArrowColumnChunk>>;

pub struct ParallelParquetWriter<W: Write + Send> {
    writer: SerializedFileWriter<W>,
    factory: ArrowRowGroupWriterFactory,
    schema: SchemaRef,
    /// Rows not yet handed to an encoder (fewer than a row group).
    pending: Vec<RecordBatch>,
    pending_rows: usize,
    /// Row groups being encoded, in file order.
    encoding: VecDeque<Receiver<Encoded>>,
    next_row_group: usize,
    rows_per_group: usize,
    max_bytes_per_group: usize,
    max_in_flight: usize,
}

impl<W: Write + Send> ParallelParquetWriter<W> {
    pub fn try_new(out: W, schema: SchemaRef, props: WriterProperties) -> Result<Self> {
        let rows_per_group = props.max_row_group_row_count().unwrap_or(1 << 20).max(1);
        let max_bytes_per_group = props.max_row_group_bytes().unwrap_or(usize::MAX);
        // ArrowWriter writes the Arrow schema into the file's metadata, as readers expect.
        let (writer, factory) =
            ArrowWriter::try_new(out, schema.clone(), Some(props))?.into_serialized_writer()?;
        Ok(Self {
            writer,
            factory,
            schema,
            pending: Vec::new(),
            pending_rows: 0,
            encoding: VecDeque::new(),
            next_row_group: 0,
            rows_per_group,
            max_bytes_per_group,
            // Enough to keep the cores busy, few enough to bound the memory held.
            max_in_flight: 2 * rayon::current_num_threads().max(1),
        })
    }

    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        if self.pending.is_empty() && self.next_row_group == 0 {
            // Wide rows (vectors carried along) make fewer rows per group.
            let per_row = (batch.get_array_memory_size() / batch.num_rows()).max(1);
            let by_bytes = self.max_bytes_per_group / per_row;
            self.rows_per_group = self.rows_per_group.min(by_bytes.max(1024));
            // At most about 512 MB of rows waiting in encoders.
            let group_bytes = self.rows_per_group.saturating_mul(per_row).max(1);
            self.max_in_flight = self.max_in_flight.min((512 << 20) / group_bytes).max(2);
        }
        self.pending.push(batch.clone());
        self.pending_rows += batch.num_rows();
        if self.pending_rows >= self.rows_per_group {
            // Joined once (not at all when one batch waits), then cut into row groups that
            // share its buffers; the rest waits for the next batch.
            let all = self.take_pending()?;
            let mut start = 0;
            while all.num_rows() - start >= self.rows_per_group {
                self.encode(all.slice(start, self.rows_per_group))?;
                start += self.rows_per_group;
            }
            if start < all.num_rows() {
                self.pending_rows = all.num_rows() - start;
                self.pending.push(all.slice(start, self.pending_rows));
            }
        }
        self.append_finished(false)
    }

    pub fn close(mut self) -> Result<()> {
        if self.pending_rows > 0 {
            let rest = self.take_pending()?;
            self.encode(rest)?;
        }
        self.append_finished(true)?;
        self.writer.close()?;
        Ok(())
    }

    /// The waiting rows as one batch; none wait afterwards.
    fn take_pending(&mut self) -> Result<RecordBatch> {
        self.pending_rows = 0;
        let mut pending = std::mem::take(&mut self.pending);
        if pending.len() == 1 {
            return Ok(pending.pop().expect("one batch"));
        }
        Ok(concat_batches(&self.schema, &pending)?)
    }

    fn encode(&mut self, group: RecordBatch) -> Result<()> {
        let writers = self.factory.create_column_writers(self.next_row_group)?;
        self.next_row_group += 1;
        let (send, receive) = channel();
        let schema = self.schema.clone();
        rayon::spawn(move || {
            let _ = send.send(encode_row_group(&schema, writers, &group));
        });
        self.encoding.push_back(receive);
        while self.encoding.len() > self.max_in_flight {
            self.append_next()?;
        }
        Ok(())
    }

    /// Appends the row groups whose encoding is done, in order; all of them when `wait`.
    fn append_finished(&mut self, wait: bool) -> Result<()> {
        while let Some(front) = self.encoding.front() {
            if !wait {
                match front.try_recv() {
                    Ok(chunks) => {
                        self.encoding.pop_front();
                        self.append(chunks)?;
                        continue;
                    }
                    Err(std::sync::mpsc::TryRecvError::Empty) => return Ok(()),
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                        return Err(encoder_lost());
                    }
                }
            }
            self.append_next()?;
        }
        Ok(())
    }

    fn append_next(&mut self) -> Result<()> {
        let Some(front) = self.encoding.pop_front() else {
            return Ok(());
        };
        let chunks = front.recv().map_err(|_| encoder_lost())?;
        self.append(chunks)
    }

    fn append(&mut self, chunks: Encoded) -> Result<()> {
        let mut row_group = self.writer.next_row_group()?;
        for chunk in chunks? {
            chunk.append_to_row_group(&mut row_group)?;
        }
        row_group.close()?;
        Ok(())
    }
}

fn encode_row_group(
    schema: &SchemaRef,
    mut writers: Vec<ArrowColumnWriter>,
    group: &RecordBatch,
) -> Encoded {
    let mut next = writers.iter_mut();
    for (field, column) in schema.fields().iter().zip(group.columns()) {
        for leaf in compute_leaves(field, column)? {
            next.next()
                .ok_or_else(|| ParquetError::General("more leaves than column writers".into()))?
                .write(&leaf)?;
        }
    }
    writers.into_iter().map(ArrowColumnWriter::close).collect()
}

fn encoder_lost() -> ParquetError {
    ParquetError::General("a row group's encoder stopped without a result".into())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Float64Array, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    use super::*;

    /// Batches of uneven sizes come back whole, in order, in row groups of the set size.
    #[test]
    fn row_groups_encoded_at_once_read_back_in_order() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("d", DataType::Float64, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let batch = |from: i64, n: i64| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from_iter_values(from..from + n)),
                    Arc::new(Float64Array::from_iter(
                        (from..from + n).map(|i| (i % 7 != 0).then_some(i as f64 / 3.0)),
                    )),
                    Arc::new(StringArray::from_iter(
                        (from..from + n).map(|i| (i % 5 != 0).then(|| format!("row {i}"))),
                    )),
                ],
            )
            .unwrap()
        };
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(1000))
            .build();
        let file = tempfile::tempfile().unwrap();
        let mut writer =
            ParallelParquetWriter::try_new(file.try_clone().unwrap(), schema.clone(), props)
                .unwrap();
        let sizes = [10, 2500, 0, 999, 1, 3000, 17];
        let mut from = 0;
        let mut want = Vec::new();
        for n in sizes {
            let b = batch(from, n);
            writer.write(&b).unwrap();
            want.push(b);
            from += n;
        }
        writer.close().unwrap();

        let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
        let groups: Vec<i64> = reader
            .metadata()
            .row_groups()
            .iter()
            .map(|g| g.num_rows())
            .collect();
        assert_eq!(groups, vec![1000, 1000, 1000, 1000, 1000, 1000, 527]);
        assert_eq!(reader.schema().as_ref(), schema.as_ref());
        let got: Vec<RecordBatch> = reader.build().unwrap().map(|b| b.unwrap()).collect();
        let got = concat_batches(&schema, &got).unwrap();
        let want = concat_batches(&schema, &want).unwrap();
        assert_eq!(got, want);
    }
}
