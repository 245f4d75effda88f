//! The index file (`.skidx`): a right side's rows and its built CPU indexes in one file.
//!
//! ```text
//! "SKIDX\0\r\n"  format version (u32 LE)  0 (u32)
//! sections, each starting 64-aligned:
//!     the rows: an Arrow IPC file of every column (the vector column in the canonical type),
//!               memory-mapped on load (its buffers are used where they lie)
//!     per metric served, per shard: a CpuIndex's arrays (cpu/persist.rs), read into place
//!     per shard: its column profile (gpu/prepare/profile.rs), what a GPU build would otherwise
//!               find in a pass over every entry (absent from files of earlier builds)
//! the header: JSON (rows, vector column, sections with their CRC-32, metrics served)
//! trailer: header offset (u64) header length (u64) header CRC-32 (u32) version (u32) "SKIDXEND"
//! ```
//!
//! Every section carries its own CRC-32, checked before its contents are used, so a damaged or
//! cut file is an error naming the file, never a wrong answer. Files are written under a
//! temporary name in the target folder and renamed into place: a reader never sees half a file,
//! and an existing file is replaced whole or not at all.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::FileDecoder;
use arrow::ipc::writer::FileWriter;
use datafusion::common::{exec_datafusion_err, exec_err, DataFusionError, Result};
use serde_json::{json, Value};

use crate::cpu::CpuIndex;
use crate::gpu::ColumnProfile;
use crate::metric::Metric;

const MAGIC: &[u8; 8] = b"SKIDX\0\r\n";
const END_MAGIC: &[u8; 8] = b"SKIDXEND";
/// The format this build writes and reads. Bump it on any change to the layout above or to
/// the arrays `cpu/persist.rs` writes.
pub const FORMAT_VERSION: u32 = 1;
const TRAILER: u64 = 32;
const ALIGN: u64 = 64;

/// One metric's CPU index as its shards: (rows, index) of consecutive row ranges.
pub(crate) type CpuShards = Vec<(usize, Arc<CpuIndex>)>;

/// Where a section lies and its checksum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Section {
    pub offset: u64,
    pub len: u64,
    pub crc: u32,
}

/// One metric's CPU index in the file: its shards (consecutive row ranges) in order.
#[derive(Debug, Clone)]
pub(crate) struct StoredIndex {
    pub metric: Metric,
    pub shards: Vec<(usize, Section)>,
}

/// What the header says.
#[derive(Debug, Clone)]
pub(crate) struct Header {
    pub rows: usize,
    pub vector_column: String,
    pub data: Section,
    pub indexes: Vec<StoredIndex>,
    /// Each shard's column profile: (rows, section); empty in files written before them.
    pub profiles: Vec<(usize, Section)>,
}

/// An open index file: its header read and checked; the rows and the indexes are read when
/// asked for.
#[derive(Debug)]
pub(crate) struct IndexFile {
    pub path: PathBuf,
    pub header: Header,
    pub schema: SchemaRef,
    /// The file, open: its sections are mapped from it, so a file removed or replaced after it
    /// was opened (an index folder's segment, two refreshes later) is still the file read.
    handle: File,
}

fn damaged(path: &Path, what: impl std::fmt::Display) -> DataFusionError {
    exec_datafusion_err!(
        "index file '{}' is damaged or cut short ({what}); build it again with `sparse-knn index`",
        path.display()
    )
}

fn io_error(path: &Path, doing: &str, e: std::io::Error) -> DataFusionError {
    exec_datafusion_err!("index file '{}': {doing}: {e}", path.display())
}

/// A writer that counts what passed and keeps its CRC-32.
struct Counting<W: Write> {
    inner: W,
    written: u64,
    crc: crc32fast::Hasher,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl<W: Write> Counting<W> {
    /// Starts a section at the next 64-byte boundary.
    fn start_section(&mut self) -> std::io::Result<u64> {
        let pad = (ALIGN - self.written % ALIGN) % ALIGN;
        self.inner.write_all(&vec![0u8; pad as usize])?;
        self.written += pad;
        self.crc = crc32fast::Hasher::new();
        Ok(self.written)
    }

    /// A section of a shard of `rows` rows, its contents written by `write`: its header entry.
    fn shard_section(
        &mut self,
        rows: usize,
        write: impl FnOnce(&mut Self) -> std::io::Result<()>,
    ) -> std::io::Result<Value> {
        let start = self.start_section()?;
        write(self)?;
        Ok(json!({"rows": rows, "section": section_json(&self.end_section(start))}))
    }

    fn end_section(&mut self, offset: u64) -> Section {
        let crc = std::mem::take(&mut self.crc).finalize();
        Section {
            offset,
            len: self.written - offset,
            crc,
        }
    }
}

fn section_json(s: &Section) -> Value {
    json!({"offset": s.offset, "len": s.len, "crc32": s.crc})
}

fn metric_json(m: &Metric) -> Value {
    json!({"metric": m.kind.name(), "p": m.p, "dim": m.dim})
}

/// Writes `batches` (schema `schema`, vector column `vector_column`) and the CPU indexes of
/// `indexes` (per metric, its shards with their row counts) to `path`, replacing it whole.
pub(crate) fn write(
    path: &Path,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    vector_column: &str,
    indexes: &[(Metric, CpuShards)],
    profiles: &[(usize, ColumnProfile)],
) -> Result<u64> {
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| exec_datafusion_err!("'{}' names no file", path.display()))?;
    let temporary = folder.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = write_to(
        &temporary,
        schema,
        batches,
        vector_column,
        indexes,
        profiles,
    )
    .and_then(|len| {
        std::fs::rename(&temporary, path)
            .map_err(|e| io_error(path, "moving the written file into place", e))?;
        Ok(len)
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result
}

fn write_to(
    path: &Path,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    vector_column: &str,
    indexes: &[(Metric, CpuShards)],
    profiles: &[(usize, ColumnProfile)],
) -> Result<u64> {
    let file = File::create(path).map_err(|e| io_error(path, "creating", e))?;
    let mut out = Counting {
        inner: BufWriter::with_capacity(1 << 20, file),
        written: 0,
        crc: crc32fast::Hasher::new(),
    };
    let io = |e| io_error(path, "writing", e);
    out.write_all(MAGIC).map_err(io)?;
    out.write_all(&FORMAT_VERSION.to_le_bytes()).map_err(io)?;
    out.write_all(&0u32.to_le_bytes()).map_err(io)?;

    let start = out.start_section().map_err(io)?;
    {
        let mut writer = FileWriter::try_new(&mut out, schema)?;
        match indexes.first() {
            // One batch per shard: a GPU build from the file then takes each shard's rows
            // where they are mapped, where a thousand batches were copied into one first
            // (0.9 s of a fresh process at 11M rows).
            Some((_, shards)) => {
                let shard_rows: Vec<usize> = shards.iter().map(|(rows, _)| *rows).collect();
                for group in group_rows(batches, &shard_rows) {
                    match group.as_slice() {
                        [one] => writer.write(one)?,
                        _ => writer.write(&arrow::compute::concat_batches(schema, &group)?)?,
                    }
                }
            }
            _ => {
                for batch in batches {
                    writer.write(batch)?;
                }
            }
        }
        writer.finish()?;
    }
    let data = out.end_section(start);
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();

    let mut stored = Vec::new();
    for (metric, shards) in indexes {
        let mut sections = Vec::new();
        for (shard_rows, index) in shards {
            sections.push(
                out.shard_section(*shard_rows, |out| index.write_to(out))
                    .map_err(io)?,
            );
        }
        let mut entry = metric_json(metric);
        entry["shards"] = Value::Array(sections);
        stored.push(entry);
    }
    let mut stored_profiles = Vec::new();
    for (shard_rows, profile) in profiles {
        stored_profiles.push(
            out.shard_section(*shard_rows, |out| profile.write_to(out))
                .map_err(io)?,
        );
    }
    let header = json!({
        "format": FORMAT_VERSION,
        "created_by": concat!("sparse-knn ", env!("CARGO_PKG_VERSION")),
        "rows": rows,
        "vector_column": vector_column,
        "data": section_json(&data),
        "indexes": stored,
        "column_profiles": stored_profiles,
    });
    let header = serde_json::to_vec_pretty(&header).map_err(|e| exec_datafusion_err!("{e}"))?;
    let header_offset = out.start_section().map_err(io)?;
    out.write_all(&header).map_err(io)?;
    let header_crc = out.end_section(header_offset).crc;
    out.write_all(&header_offset.to_le_bytes()).map_err(io)?;
    out.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(io)?;
    out.write_all(&header_crc.to_le_bytes()).map_err(io)?;
    out.write_all(&FORMAT_VERSION.to_le_bytes()).map_err(io)?;
    out.write_all(END_MAGIC).map_err(io)?;
    out.flush().map_err(io)?;
    let written = out.written;
    out.inner
        .into_inner()
        .map_err(|e| io(e.into_error()))?
        .sync_all()
        .map_err(io)?;
    Ok(written)
}

/// `batches` cut into consecutive groups of `rows[i]` rows each (slices, not copies); rows
/// past the last group make one more.
fn group_rows(batches: &[RecordBatch], rows: &[usize]) -> Vec<Vec<RecordBatch>> {
    let mut groups: Vec<Vec<RecordBatch>> = vec![Vec::new()];
    let mut wanted = rows.iter().copied();
    let mut room = wanted.next().unwrap_or(usize::MAX);
    for batch in batches {
        let mut start = 0;
        while start < batch.num_rows() {
            if room == 0 {
                groups.push(Vec::new());
                room = wanted.next().unwrap_or(usize::MAX);
            }
            let take = room.min(batch.num_rows() - start);
            groups
                .last_mut()
                .expect("a group")
                .push(batch.slice(start, take));
            start += take;
            room -= take;
        }
    }
    groups.retain(|g| !g.is_empty());
    groups
}

fn read_u32(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes.try_into().expect("4 bytes"))
}

fn read_u64(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes.try_into().expect("8 bytes"))
}

fn parse_section(path: &Path, v: &Value, size: u64) -> Result<Section> {
    let field = |name: &str| v.get(name).and_then(Value::as_u64);
    let (Some(offset), Some(len), Some(crc)) = (field("offset"), field("len"), field("crc32"))
    else {
        return Err(damaged(
            path,
            "a section without offset, length or checksum",
        ));
    };
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(damaged(path, "a section past the end of the file"));
    }
    Ok(Section {
        offset,
        len,
        crc: crc as u32,
    })
}

/// Shard entries (`{"rows", "section"}`, written by `Counting::shard_section`) as (rows,
/// section); `what` names one in errors.
fn parse_shard_sections(
    path: &Path,
    list: &[Value],
    what: &str,
    size: u64,
) -> Result<Vec<(usize, Section)>> {
    list.iter()
        .map(|entry| {
            let rows = entry
                .get("rows")
                .and_then(Value::as_u64)
                .ok_or_else(|| damaged(path, format!("{what} without its rows")))?;
            let section = entry
                .get("section")
                .ok_or_else(|| damaged(path, format!("{what} without its section")))?;
            Ok((rows as usize, parse_section(path, section, size)?))
        })
        .collect()
}

fn parse_metric(path: &Path, v: &Value) -> Result<Metric> {
    let name = v
        .get("metric")
        .and_then(Value::as_str)
        .ok_or_else(|| damaged(path, "an index without its metric"))?;
    let p = v.get("p").and_then(Value::as_f64);
    let dim = v.get("dim").and_then(Value::as_u64);
    Metric::new(name, p, dim).map_err(|e| damaged(path, e))
}

impl IndexFile {
    /// Opens `path` and checks its header (magic, version, checksum, sections in bounds); the
    /// rows and indexes are read later.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let mut file = File::open(path).map_err(|e| io_error(path, "opening", e))?;
        let size = file
            .metadata()
            .map_err(|e| io_error(path, "reading its size", e))?
            .len();
        let mut start = [0u8; 16];
        if size < 16 || file.read_exact(&mut start).is_err() || &start[..8] != MAGIC {
            return exec_err!(
                "'{}' is not a sparse-knn index file (no SKIDX header); make one with `sparse-knn index`",
                path.display()
            );
        }
        let version = read_u32(&start[8..12]);
        if version != FORMAT_VERSION {
            return exec_err!(
                "index file '{}' has format version {version}; this sparse-knn reads version \
                 {FORMAT_VERSION}: build it again with `sparse-knn index`",
                path.display()
            );
        }
        if size < 16 + TRAILER {
            return Err(damaged(path, format!("{size} bytes")));
        }
        let mut trailer = [0u8; TRAILER as usize];
        file.seek(SeekFrom::Start(size - TRAILER))
            .and_then(|_| file.read_exact(&mut trailer))
            .map_err(|e| io_error(path, "reading", e))?;
        if &trailer[24..] != END_MAGIC || read_u32(&trailer[20..24]) != FORMAT_VERSION {
            return Err(damaged(path, "no end marker"));
        }
        let (offset, len, crc) = (
            read_u64(&trailer[..8]),
            read_u64(&trailer[8..16]),
            read_u32(&trailer[16..20]),
        );
        if offset
            .checked_add(len)
            .is_none_or(|end| end > size - TRAILER)
        {
            return Err(damaged(path, "the header lies past the end"));
        }
        let mut header = vec![0u8; len as usize];
        file.seek(SeekFrom::Start(offset))
            .and_then(|_| file.read_exact(&mut header))
            .map_err(|e| io_error(path, "reading", e))?;
        if crc32fast::hash(&header) != crc {
            return Err(damaged(path, "the header's checksum does not match"));
        }
        let header: Value =
            serde_json::from_slice(&header).map_err(|e| damaged(path, format!("header: {e}")))?;
        let rows = header
            .get("rows")
            .and_then(Value::as_u64)
            .ok_or_else(|| damaged(path, "no row count"))? as usize;
        let vector_column = header
            .get("vector_column")
            .and_then(Value::as_str)
            .ok_or_else(|| damaged(path, "no vector column"))?
            .to_string();
        let data = parse_section(
            path,
            header.get("data").ok_or_else(|| damaged(path, "no rows"))?,
            size,
        )?;
        let mut indexes = Vec::new();
        for entry in header
            .get("indexes")
            .and_then(Value::as_array)
            .ok_or_else(|| damaged(path, "no index list"))?
        {
            let metric = parse_metric(path, entry)?;
            let shards = entry
                .get("shards")
                .and_then(Value::as_array)
                .ok_or_else(|| damaged(path, "an index without shards"))?;
            let shards = parse_shard_sections(path, shards, "a shard", size)?;
            if shards.iter().map(|s| s.0).sum::<usize>() != rows {
                return Err(damaged(path, "an index's shards do not cover the rows"));
            }
            indexes.push(StoredIndex { metric, shards });
        }
        let profiles = match header.get("column_profiles").and_then(Value::as_array) {
            Some(list) => parse_shard_sections(path, list, "a column profile", size)?,
            None => Vec::new(),
        };
        if !profiles.is_empty() && profiles.iter().map(|p| p.0).sum::<usize>() != rows {
            return Err(damaged(path, "the column profiles do not cover the rows"));
        }
        let schema = read_schema(path, &mut file, &data)?;
        Ok(IndexFile {
            path: path.to_path_buf(),
            header: Header {
                rows,
                vector_column,
                data,
                indexes,
                profiles,
            },
            schema,
            handle: file,
        })
    }

    /// The rows: the file mapped into memory, the section checked, its batches decoded where
    /// they lie (no copy).
    pub(crate) fn read_batches(&self) -> Result<Vec<RecordBatch>> {
        let path = &self.path;
        let section = self.header.data;
        let started = std::time::Instant::now();
        let map = Arc::new(Mmap::map(&self.handle, path, section.offset, section.len)?);
        let bytes = map.slice(section.offset, section.len);
        if map.checksum(bytes) != section.crc {
            return Err(damaged(path, "the rows' checksum does not match"));
        }
        log::debug!(
            "index file '{}': {} bytes of rows mapped and checked in {:?}",
            path.display(),
            bytes.len(),
            started.elapsed()
        );
        let owner: Arc<Mmap> = Arc::clone(&map);
        // SAFETY: the pointer and length lie inside the mapping, which `owner` keeps alive for
        // as long as any buffer made from it.
        let buffer = unsafe {
            Buffer::from_custom_allocation(
                NonNull::new(bytes.as_ptr() as *mut u8).expect("a mapped address"),
                bytes.len(),
                owner,
            )
        };
        decode_ipc(&buffer).map_err(|e| damaged(path, e))
    }

    /// Each shard's column profile, (rows, profile), each section read and checked; None for a
    /// file written before them.
    pub(crate) fn read_profiles(&self) -> Result<Option<Vec<(usize, ColumnProfile)>>> {
        if self.header.profiles.is_empty() {
            return Ok(None);
        }
        use std::os::unix::fs::FileExt;
        let path = &self.path;
        let mut profiles = Vec::with_capacity(self.header.profiles.len());
        for &(rows, section) in &self.header.profiles {
            let mut bytes = vec![0u8; section.len as usize];
            self.handle
                .read_exact_at(&mut bytes, section.offset)
                .map_err(|e| io_error(path, "reading", e))?;
            if crc32fast::hash(&bytes) != section.crc {
                return Err(damaged(path, "a column profile's checksum does not match"));
            }
            let profile = ColumnProfile::read_from(&bytes).map_err(|e| damaged(path, e))?;
            profiles.push((rows, profile));
        }
        Ok(Some(profiles))
    }

    /// The CPU index of `stored`, shard by shard, each section mapped and checked; the
    /// postings stay in the mapping (copied, 1M nytimes rows' 1.7 GB of them were most of a
    /// fresh process's time: the kernel zeroing fresh pages, then the copy).
    pub(crate) fn read_index(&self, stored: &StoredIndex) -> Result<Vec<(usize, CpuIndex)>> {
        let path = &self.path;
        let mut shards = Vec::with_capacity(stored.shards.len());
        for &(rows, section) in &stored.shards {
            let map = Arc::new(Mmap::map(&self.handle, path, section.offset, section.len)?);
            let bytes = map.slice(section.offset, section.len);
            if map.checksum(bytes) != section.crc {
                return Err(damaged(path, "an index's checksum does not match"));
            }
            let owner: Arc<dyn arrow::alloc::Allocation> = Arc::clone(&map) as _;
            let index = CpuIndex::read_mapped(&stored.metric, bytes, owner)
                .map_err(|e| damaged(path, e))?;
            if index.rows() != rows {
                return Err(damaged(path, "an index's rows do not match its shard"));
            }
            shards.push((rows, index));
        }
        Ok(shards)
    }
}

/// The schema of the rows' IPC file, read from its footer alone.
fn read_schema(path: &Path, file: &mut File, data: &Section) -> Result<SchemaRef> {
    if data.len < 10 {
        return Err(damaged(path, "the rows' section is too short"));
    }
    let mut tail = [0u8; 10];
    file.seek(SeekFrom::Start(data.offset + data.len - 10))
        .and_then(|_| file.read_exact(&mut tail))
        .map_err(|e| io_error(path, "reading", e))?;
    let footer_len =
        arrow::ipc::reader::read_footer_length(tail).map_err(|e| damaged(path, e))? as u64;
    if footer_len + 10 > data.len {
        return Err(damaged(path, "the rows' footer is longer than its section"));
    }
    let mut footer = vec![0u8; footer_len as usize];
    file.seek(SeekFrom::Start(data.offset + data.len - 10 - footer_len))
        .and_then(|_| file.read_exact(&mut footer))
        .map_err(|e| io_error(path, "reading", e))?;
    let footer = arrow::ipc::root_as_footer(&footer).map_err(|e| damaged(path, e))?;
    let schema = footer
        .schema()
        .ok_or_else(|| damaged(path, "the rows have no schema"))?;
    Ok(Arc::new(arrow::ipc::convert::fb_to_schema(schema)))
}

fn decode_ipc(buffer: &Buffer) -> std::result::Result<Vec<RecordBatch>, String> {
    let len = buffer.len();
    if len < 10 {
        return Err("the rows' section is too short".into());
    }
    let tail: [u8; 10] = buffer[len - 10..].try_into().expect("10 bytes");
    let footer_len = arrow::ipc::reader::read_footer_length(tail).map_err(|e| e.to_string())?;
    if footer_len + 10 > len {
        return Err("the rows' footer is longer than its section".into());
    }
    let footer = arrow::ipc::root_as_footer(&buffer[len - 10 - footer_len..len - 10])
        .map_err(|e| e.to_string())?;
    let schema = Arc::new(arrow::ipc::convert::fb_to_schema(
        footer.schema().ok_or("the rows have no schema")?,
    ));
    let mut decoder = FileDecoder::new(schema, footer.version()).with_require_alignment(false);
    for block in footer.dictionaries().iter().flatten() {
        let block_len = block.bodyLength() as usize + block.metaDataLength() as usize;
        let data = slice(buffer, block.offset(), block_len)?;
        decoder
            .read_dictionary(block, &data)
            .map_err(|e| e.to_string())?;
    }
    let mut batches = Vec::new();
    for block in footer.recordBatches().iter().flatten() {
        let block_len = block.bodyLength() as usize + block.metaDataLength() as usize;
        let data = slice(buffer, block.offset(), block_len)?;
        if let Some(batch) = decoder
            .read_record_batch(block, &data)
            .map_err(|e| e.to_string())?
        {
            batches.push(batch);
        }
    }
    Ok(batches)
}

fn slice(buffer: &Buffer, offset: i64, len: usize) -> std::result::Result<Buffer, String> {
    let offset = usize::try_from(offset).map_err(|_| "a negative block offset".to_string())?;
    if offset.checked_add(len).is_none_or(|end| end > buffer.len()) {
        return Err("a block past the end of the rows".into());
    }
    Ok(buffer.slice_with_length(offset, len))
}

/// A read-only memory map of part of a file: from `base` (a page boundary) on.
struct Mmap {
    ptr: NonNull<u8>,
    len: usize,
    base: u64,
}

// SAFETY: the mapping is read-only and never changed through this handle.
unsafe impl Send for Mmap {}
unsafe impl Sync for Mmap {}
impl std::panic::RefUnwindSafe for Mmap {}

impl Mmap {
    /// Maps bytes `offset..offset + len` of `file` (`path`, checked against its size), from the
    /// page that holds `offset`.
    fn map(file: &File, path: &Path, offset: u64, len: u64) -> Result<Self> {
        use std::os::fd::AsRawFd;
        let size = file
            .metadata()
            .map_err(|e| io_error(path, "reading its size", e))?
            .len();
        let end = offset
            .checked_add(len)
            .filter(|&end| len > 0 && end <= size);
        if end.is_none() {
            return Err(damaged(path, "a section lies past the end of the file"));
        }
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        let base = offset / page * page;
        let len = (offset + len - base) as usize;
        // SAFETY: a private read-only mapping of an open file; checked for failure below. Its
        // pages are mapped by `checksum`, a piece on each core.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                base as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io_error(
                path,
                "mapping into memory",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(Mmap {
            ptr: NonNull::new(ptr.cast()).expect("mmap returns no null mapping"),
            len,
            base,
        })
    }

    /// The CRC-32 of `bytes` (a slice of this mapping): its pieces mapped in
    /// (`MADV_POPULATE_READ`) and hashed on the rayon pool, then combined. Mapping a whole
    /// section at once (`MAP_POPULATE`) ran on one core: 11M rows' 18 GB took seconds of a
    /// fresh process; faulting pieces in one page at a time took longer than reading them.
    fn checksum(&self, bytes: &[u8]) -> u32 {
        use rayon::prelude::*;
        const PIECE: usize = 64 << 20;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let populate = |piece: &[u8]| {
            let start = piece.as_ptr() as usize;
            let aligned = (start - start % page).max(self.ptr.as_ptr() as usize);
            // SAFETY: the range lies inside the mapping (its base is page-aligned); advice
            // changes no contents, and a kernel without it leaves the reads to fault them in.
            unsafe {
                libc::madvise(
                    aligned as *mut libc::c_void,
                    start + piece.len() - aligned,
                    libc::MADV_POPULATE_READ,
                )
            };
        };
        let parts: Vec<crc32fast::Hasher> = bytes
            .par_chunks(PIECE)
            .map(|piece| {
                populate(piece);
                let mut h = crc32fast::Hasher::new();
                h.update(piece);
                h
            })
            .collect();
        let mut whole = crc32fast::Hasher::new();
        for part in parts {
            whole.combine(&part);
        }
        whole.finalize()
    }

    /// Bytes `offset..offset + len` of the file (inside what was mapped).
    fn slice(&self, offset: u64, len: u64) -> &[u8] {
        assert!(offset >= self.base, "a section inside the mapping");
        let (offset, len) = ((offset - self.base) as usize, len as usize);
        assert!(
            offset + len <= self.len,
            "a section checked against the file size"
        );
        // SAFETY: inside the mapping, which lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) }
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, Int32Array};
    use arrow::datatypes::{DataType, Field, Schema};

    fn batch(values: std::ops::Range<i32>) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int32, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int32Array::from_iter_values(values))]).unwrap()
    }

    fn ids(group: &[RecordBatch]) -> Vec<i32> {
        group
            .iter()
            .flat_map(|b| {
                let a = b.column(0).as_any().downcast_ref::<Int32Array>().unwrap();
                (0..a.len()).map(|i| a.value(i)).collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn rows_are_grouped_by_shard_across_batch_boundaries() {
        let batches = vec![batch(0..4), batch(4..5), batch(5..11)];
        let groups = group_rows(&batches, &[3, 5, 3]);
        let got: Vec<Vec<i32>> = groups.iter().map(|g| ids(g)).collect();
        assert_eq!(
            got,
            vec![vec![0, 1, 2], vec![3, 4, 5, 6, 7], vec![8, 9, 10]]
        );
        // A whole batch that is a shard stays one slice (written without a copy).
        let groups = group_rows(&batches[..1], &[4]);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].len(), 1);
        // Rows past the shards given make one more group.
        let got: Vec<Vec<i32>> = group_rows(&batches, &[2]).iter().map(|g| ids(g)).collect();
        assert_eq!(got, vec![vec![0, 1], (2..11).collect::<Vec<_>>()]);
    }
}
