//! An index folder (`NAME.skidx/`): an index of a folder of files kept in segments, each an index
//! file (`file.rs`) of a run of the source's files, named in `manifest.json` with the files each
//! was built from (size, modification time, ETag). `sparse-knn index` over the grown folder
//! writes only the segments of the files it has not seen (`cli/index.rs`).
//!
//! A reader never sees half an index: segments are written under new names and never rewritten;
//! the manifest is written aside and renamed into place; a segment leaves the folder only once
//! two manifests have stopped naming it (a reader that read the one before may still open it).
//! Readers take no lock; writers take `.lock` (released by the system if the writer dies).
//!
//! ```text
//! NAME.skidx/
//!     manifest.json                  {"sparse_knn_index_folder": 1, "generation": 3, "segments":
//!                                      [{"file": "segment-000001-000.skidx", "rows": ...,
//!                                        "sources": [{"location": ..., "size": ..., ...}]}], ...}
//!     segment-000001-000.skidx       an index file of the first run of files
//!     segment-000003-000.skidx       written by the third run: the files added since
//! ```

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::{exec_datafusion_err, exec_err, DataFusionError, Result};
use serde_json::{json, Value};

use super::file::{IndexFile, StoredIndex};
use super::identity::FileStamp;
use super::segments::{merge_groups, runs_against, Run};
use crate::cpu::CpuIndex;
use crate::gpu::ColumnProfile;
use crate::metric::Metric;

/// The manifest's name in the folder.
pub const MANIFEST: &str = "manifest.json";
/// The manifest format this build writes and reads.
const MANIFEST_VERSION: u64 = 1;
/// The lock a writer holds while it changes the folder.
const LOCK: &str = ".lock";
/// Times a reader reads the manifest again when a segment it names went away meanwhile.
const READ_ATTEMPTS: usize = 5;

/// One segment in a manifest: its index file (None where its files hold no row), its rows, and
/// the source files it was built from, in row order.
#[derive(Debug, Clone)]
pub(crate) struct SegmentEntry {
    pub file: Option<String>,
    pub rows: usize,
    pub sources: Vec<FileStamp>,
}

/// What `manifest.json` says.
#[derive(Debug, Clone)]
pub(crate) struct Manifest {
    pub generation: u64,
    /// What the index was built from and how (`sparse-knn index`'s arguments): a refresh keeps
    /// them, and refuses other ones.
    pub input: String,
    pub metrics: Vec<String>,
    pub options: String,
    pub segments: Vec<SegmentEntry>,
}

fn bad_manifest(folder: &Path, what: impl std::fmt::Display) -> DataFusionError {
    exec_datafusion_err!(
        "index folder '{}': its {MANIFEST} is damaged ({what}); build the index again with \
         `sparse-knn index --overwrite`",
        folder.display()
    )
}

impl Manifest {
    /// The manifest of `folder`; Ok(None) where it has none.
    pub(crate) fn read(folder: &Path) -> Result<Option<Self>> {
        let path = folder.join(MANIFEST);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return exec_err!(
                    "index folder '{}': reading {MANIFEST}: {e}",
                    folder.display()
                )
            }
        };
        let value: Value = serde_json::from_slice(&bytes).map_err(|e| bad_manifest(folder, e))?;
        let version = value.get("sparse_knn_index_folder").and_then(Value::as_u64);
        match version {
            Some(MANIFEST_VERSION) => {}
            Some(v) => {
                return exec_err!(
                    "index folder '{}' has manifest version {v}; this sparse-knn reads version \
                     {MANIFEST_VERSION}: build it again with `sparse-knn index --overwrite`",
                    folder.display()
                )
            }
            None => return Err(bad_manifest(folder, "not an index folder's manifest")),
        }
        let text = |key: &str| {
            value
                .get(key)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| bad_manifest(folder, format!("no {key}")))
        };
        let mut segments = Vec::new();
        for entry in value
            .get("segments")
            .and_then(Value::as_array)
            .ok_or_else(|| bad_manifest(folder, "no segment list"))?
        {
            let file = match entry.get("file") {
                Some(Value::String(name)) if is_segment_name(name) => Some(name.clone()),
                Some(Value::Null) => None,
                _ => return Err(bad_manifest(folder, "a segment without a valid file name")),
            };
            let rows = entry
                .get("rows")
                .and_then(Value::as_u64)
                .ok_or_else(|| bad_manifest(folder, "a segment without rows"))?
                as usize;
            let sources = entry
                .get("sources")
                .and_then(Value::as_array)
                .ok_or_else(|| bad_manifest(folder, "a segment without sources"))?
                .iter()
                .map(|s| FileStamp::from_json(s).ok_or_else(|| bad_manifest(folder, "a source")))
                .collect::<Result<Vec<_>>>()?;
            segments.push(SegmentEntry {
                file,
                rows,
                sources,
            });
        }
        Ok(Some(Manifest {
            generation: value
                .get("generation")
                .and_then(Value::as_u64)
                .ok_or_else(|| bad_manifest(folder, "no generation"))?,
            input: text("input")?,
            metrics: value
                .get("metrics")
                .and_then(Value::as_array)
                .ok_or_else(|| bad_manifest(folder, "no metric list"))?
                .iter()
                .map(|m| m.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad_manifest(folder, "a metric"))?,
            options: text("options")?,
            segments,
        }))
    }

    /// Writes the manifest into `folder` under a temporary name, flushed to disk, then renames it
    /// into place: a reader reads the old manifest or this one whole.
    pub(crate) fn write(&self, folder: &Path) -> Result<()> {
        let value = json!({
            "sparse_knn_index_folder": MANIFEST_VERSION,
            "generation": self.generation,
            "input": self.input,
            "metrics": self.metrics,
            "options": self.options,
            "rows": self.rows(),
            "segments": self.segments.iter().map(|s| json!({
                "file": s.file,
                "rows": s.rows,
                "sources": s.sources.iter().map(FileStamp::to_json).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        });
        let io = |doing: &str, e: std::io::Error| {
            exec_datafusion_err!("index folder '{}': {doing}: {e}", folder.display())
        };
        let temporary = folder.join(format!(".{MANIFEST}.tmp-{}", std::process::id()));
        let written = (|| -> std::io::Result<()> {
            let mut file = File::create(&temporary)?;
            file.write_all(&serde_json::to_vec_pretty(&value).map_err(std::io::Error::other)?)?;
            file.sync_all()
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&temporary);
            return Err(io("writing the manifest", e));
        }
        std::fs::rename(&temporary, folder.join(MANIFEST))
            .map_err(|e| io("moving the manifest into place", e))?;
        // The rename itself reaches the disk with the folder's entry.
        if let Ok(dir) = File::open(folder) {
            let _ = dir.sync_all();
        }
        Ok(())
    }

    pub(crate) fn rows(&self) -> usize {
        self.segments.iter().map(|s| s.rows).sum()
    }

    /// The segment files it names.
    pub(crate) fn files(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().filter_map(|s| s.file.as_deref())
    }
}

/// The name of the `index`-th segment written by the manifest of `generation`: never the name of
/// a segment an earlier manifest named, so no segment is ever rewritten.
pub(crate) fn segment_name(generation: u64, index: usize) -> String {
    format!("segment-{generation:06}-{index:03}.skidx")
}

fn is_segment_name(name: &str) -> bool {
    name.starts_with("segment-") && name.ends_with(".skidx") && !name.contains(['/', '\\'])
}

/// Whether `folder` holds nothing but what a writer of an index folder leaves (segments, hidden
/// files): a first build that was interrupted before its manifest may be run again there.
pub(crate) fn holds_only_index_files(folder: &Path) -> bool {
    std::fs::read_dir(folder).is_ok_and(|entries| {
        entries.flatten().all(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            name.starts_with('.') || is_segment_name(&name)
        })
    })
}

/// The lock of a writer of `folder` (`sparse-knn index`), held while it lives; a second writer is
/// refused at once. The system releases it when its process ends, however it ends.
pub(crate) struct WriterLock {
    _file: File,
}

impl WriterLock {
    pub(crate) fn take(folder: &Path) -> Result<Self> {
        let path = folder.join(LOCK);
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| {
                exec_datafusion_err!("index folder '{}': opening {LOCK}: {e}", folder.display())
            })?;
        match file.try_lock() {
            Ok(()) => Ok(Self { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => exec_err!(
                "index folder '{}' is being written by another `sparse-knn index`; run this one \
                 when it ends",
                folder.display()
            ),
            Err(std::fs::TryLockError::Error(e)) => {
                exec_err!("index folder '{}': locking {LOCK}: {e}", folder.display())
            }
        }
    }
}

/// Removes what no reader can need: segment files named by neither `current` nor `previous`
/// (a reader may have read the previous manifest and not yet opened its segments), and the
/// temporary files of writers that died (the caller holds the writer lock, so no writer lives).
pub(crate) fn remove_unused(folder: &Path, current: &Manifest, previous: Option<&Manifest>) {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return;
    };
    let keep: Vec<&str> = current
        .files()
        .chain(previous.into_iter().flat_map(Manifest::files))
        .collect();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let stale_segment = is_segment_name(&name) && !keep.contains(&name.as_str());
        let stale_temporary = name.starts_with('.') && name.contains(".tmp-");
        if stale_segment || stale_temporary {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The runs of `files` (the source's files now, in row order) against the segments of
/// `previous`: a segment whose files all appear unchanged where they fall is kept (the longest
/// first), the files between are built; then runs of similar sizes merge as the session's
/// segments do ([`merge_groups`]: about log2 n segments), the new files' rows estimated from
/// their bytes at the kept segments' rows per byte.
pub(crate) fn plan_runs(previous: &[SegmentEntry], files: &[FileStamp]) -> Vec<Run> {
    let mut runs = runs_against(previous, |s| &s.sources, files);
    let (kept_rows, kept_bytes) = runs
        .iter()
        .filter_map(|r| match r {
            Run::Kept(i, files_of) => Some((previous[*i].rows, bytes(&files[files_of.clone()]))),
            Run::Build(_) => None,
        })
        .fold((0usize, 0u64), |(r, b), (rows, by)| (r + rows, b + by));
    let rows_per_byte = match kept_bytes {
        0 => 0.0,
        b => kept_rows as f64 / b as f64,
    };
    let rows: Vec<usize> = runs
        .iter()
        .map(|r| match r {
            Run::Kept(i, _) => previous[*i].rows,
            Run::Build(f) => ((bytes(&files[f.clone()]) as f64 * rows_per_byte) as usize).max(1),
        })
        .collect();
    for group in merge_groups(&rows).into_iter().rev() {
        let start = runs[group.start].files().start;
        let end = runs[group.end - 1].files().end;
        runs.splice(group, [Run::Build(start..end)]);
    }
    runs
}

fn bytes(files: &[FileStamp]) -> u64 {
    files.iter().map(FileStamp::size).sum()
}

/// The files `previous` was built from that are not as they were in `files`: (the file, what
/// happened to it).
pub(crate) fn changed_sources(
    previous: &[SegmentEntry],
    files: &[FileStamp],
) -> Vec<(String, &'static str)> {
    let now: std::collections::HashMap<String, &FileStamp> =
        files.iter().map(|f| (f.display(), f)).collect();
    previous
        .iter()
        .flat_map(|s| s.sources.iter())
        .filter_map(|old| match now.get(&old.display()) {
            None => Some((old.display(), "removed")),
            Some(new) if *new != old => Some((old.display(), "rewritten")),
            Some(_) => None,
        })
        .collect()
}

/// An index file, or an index folder's segments as one index: the rows and each metric's shards
/// of every segment, end to end.
#[derive(Debug)]
pub(crate) struct Stored {
    /// The file or the folder, as opened.
    pub path: PathBuf,
    pub folder: bool,
    segments: Vec<IndexFile>,
    pub schema: SchemaRef,
    pub vector_column: String,
    pub rows: usize,
    /// The metrics every segment serves.
    pub metrics: Vec<Metric>,
}

impl Stored {
    /// Opens an index file, or the segments an index folder's manifest names (each header
    /// checked; rows and indexes are read when asked for).
    pub(crate) fn open(path: &Path) -> Result<Self> {
        if !path.is_dir() {
            let file = IndexFile::open(path)?;
            return Ok(Stored {
                path: path.to_path_buf(),
                folder: false,
                schema: file.schema.clone(),
                vector_column: file.header.vector_column.clone(),
                rows: file.header.rows,
                metrics: file.header.indexes.iter().map(|s| s.metric).collect(),
                segments: vec![file],
            });
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            let Some(manifest) = Manifest::read(path)? else {
                return exec_err!(
                    "'{}' is a folder without {MANIFEST}: not an index folder, or `sparse-knn \
                     index` is writing it for the first time",
                    path.display()
                );
            };
            // A writer removes a segment two manifests after the last one that named it: one
            // that went away between reading the manifest and opening it means a newer manifest.
            let gone = manifest.files().any(|name| !path.join(name).exists());
            if gone && attempt < READ_ATTEMPTS {
                continue;
            }
            return Self::open_segments(path, &manifest);
        }
    }

    fn open_segments(folder: &Path, manifest: &Manifest) -> Result<Self> {
        let mut segments = Vec::new();
        for entry in &manifest.segments {
            let Some(name) = &entry.file else { continue };
            let file = IndexFile::open(&folder.join(name))?;
            if file.header.rows != entry.rows {
                return Err(bad_manifest(
                    folder,
                    format!(
                        "{name} holds {} rows, the manifest says {}",
                        file.header.rows, entry.rows
                    ),
                ));
            }
            segments.push(file);
        }
        let Some(first) = segments.first() else {
            return exec_err!(
                "index folder '{}' holds no row: its files were empty when it was built",
                folder.display()
            );
        };
        let metrics: Vec<Metric> = first.header.indexes.iter().map(|s| s.metric).collect();
        for other in &segments[1..] {
            let other_metrics: Vec<Metric> =
                other.header.indexes.iter().map(|s| s.metric).collect();
            if other.schema != first.schema
                || other.header.vector_column != first.header.vector_column
                || other_metrics != metrics
            {
                return Err(bad_manifest(
                    folder,
                    format!(
                        "{} and {} differ in their columns or metrics",
                        first.path.display(),
                        other.path.display()
                    ),
                ));
            }
        }
        Ok(Stored {
            path: folder.to_path_buf(),
            folder: true,
            schema: first.schema.clone(),
            vector_column: first.header.vector_column.clone(),
            rows: segments.iter().map(|s| s.header.rows).sum(),
            metrics,
            segments,
        })
    }

    /// "index file 'x'" or "index folder 'x'", for messages.
    pub(crate) fn describe(&self) -> String {
        let kind = if self.folder { "folder" } else { "file" };
        format!("index {kind} '{}'", self.path.display())
    }

    /// Every segment's rows, in order (memory-mapped where they lie).
    pub(crate) fn read_batches(&self) -> Result<Vec<RecordBatch>> {
        let mut batches = Vec::new();
        for segment in &self.segments {
            batches.extend(segment.read_batches()?);
        }
        Ok(batches)
    }

    /// The column profiles a one-GPU build over these rows would compute, where the file has
    /// them: only for one segment (a build over several cuts its shards across their ends).
    pub(crate) fn read_profiles(&self) -> Result<Option<Vec<(usize, ColumnProfile)>>> {
        match &self.segments[..] {
            [one] => one.read_profiles(),
            _ => Ok(None),
        }
    }

    /// `metric`'s CPU index as every segment's shards end to end; None where it is not stored.
    pub(crate) fn read_index(&self, metric: &Metric) -> Result<Option<Vec<(usize, CpuIndex)>>> {
        let mut shards = Vec::new();
        for segment in &self.segments {
            let stored: Option<&StoredIndex> =
                segment.header.indexes.iter().find(|s| &s.metric == metric);
            let Some(stored) = stored else {
                return Ok(None);
            };
            shards.extend(segment.read_index(stored)?);
        }
        Ok(Some(shards))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(name: &str, size: u64) -> FileStamp {
        FileStamp::for_test(name, size)
    }

    #[test]
    fn a_manifest_written_is_read_back_and_a_foreign_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = Manifest {
            generation: 3,
            input: "docs/".into(),
            metrics: vec!["cosine".into(), "minkowski".into()],
            options: "p=3".into(),
            segments: vec![
                SegmentEntry {
                    file: Some(segment_name(1, 0)),
                    rows: 10,
                    sources: vec![stamp("docs/a.parquet", 5), stamp("docs/b.parquet", 6)],
                },
                SegmentEntry {
                    file: None,
                    rows: 0,
                    sources: vec![stamp("docs/c.parquet", 7)],
                },
            ],
        };
        manifest.write(dir.path()).unwrap();
        let read = Manifest::read(dir.path()).unwrap().unwrap();
        assert_eq!(read.generation, 3);
        assert_eq!(read.metrics, manifest.metrics);
        assert_eq!(read.rows(), 10);
        assert_eq!(read.segments[0].sources, manifest.segments[0].sources);
        assert_eq!(read.segments[1].file, None);
        assert_eq!(
            read.files().collect::<Vec<_>>(),
            vec!["segment-000001-000.skidx"]
        );
        // Nothing left beside it but the manifest.
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        assert_eq!(names, vec![MANIFEST.to_string()]);

        std::fs::write(dir.path().join(MANIFEST), br#"{"segments": []}"#).unwrap();
        let err = Manifest::read(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("not an index folder") && err.contains("--overwrite"),
            "{err}"
        );
        // A segment name that would lead out of the folder.
        std::fs::write(
            dir.path().join(MANIFEST),
            br#"{"sparse_knn_index_folder": 1, "generation": 1, "input": "x", "metrics": [],
                 "options": "", "segments": [{"file": "../segment-1.skidx", "rows": 1,
                 "sources": []}]}"#,
        )
        .unwrap();
        let err = Manifest::read(dir.path()).unwrap_err().to_string();
        assert!(err.contains("valid file name"), "{err}");
    }

    fn entry(sources: &[FileStamp], rows: usize) -> SegmentEntry {
        SegmentEntry {
            file: Some(segment_name(1, 0)),
            rows,
            sources: sources.to_vec(),
        }
    }

    #[test]
    fn new_files_are_built_beside_the_kept_segments_and_similar_neighbours_merge() {
        let files: Vec<FileStamp> = (0..6).map(|i| stamp(&format!("f{i}"), 1000)).collect();
        // A file added after a segment of five: a run of its own (10 rows a byte kept: about
        // 10,000 rows, not within 2x of 50,000).
        let previous = vec![entry(&files[..5], 50_000)];
        assert_eq!(
            plan_runs(&previous, &files),
            vec![Run::Kept(0, 0..5), Run::Build(5..6)]
        );
        // Nothing new: everything kept.
        assert_eq!(plan_runs(&previous, &files[..5]), vec![Run::Kept(0, 0..5)]);
        // As many new files as the segment holds: the two merge, its files read again.
        let previous = vec![entry(&files[..3], 30_000)];
        assert_eq!(plan_runs(&previous, &files), vec![Run::Build(0..6)]);
        // A file rewritten in the middle: the run built again from its segment's files (about
        // 30,000 rows) merges with the 40,000 after it; the 20,000 before stay apart (70,000).
        let previous = vec![
            entry(&files[..2], 20_000),
            entry(&files[2..4], 20_000),
            entry(&files[4..6], 40_000),
        ];
        let mut now = files.clone();
        now[2] = stamp("f2", 999);
        assert_eq!(
            plan_runs(&previous, &now),
            vec![Run::Kept(0, 0..2), Run::Build(2..6)]
        );
        // A segment of similar size to the new run: merged with it, built again from its files.
        let previous = vec![entry(&files[..5], 500_000), entry(&files[5..6], 100)];
        let mut grown = files.clone();
        grown.push(stamp("f6", 1));
        assert_eq!(
            plan_runs(&previous, &grown),
            vec![Run::Kept(0, 0..5), Run::Build(5..7)]
        );
    }

    #[test]
    fn removed_and_rewritten_sources_are_named() {
        let files: Vec<FileStamp> = (0..3).map(|i| stamp(&format!("f{i}"), 10)).collect();
        let previous = vec![entry(&files, 30)];
        let now = vec![stamp("f0", 10), stamp("f2", 11), stamp("f3", 10)];
        assert_eq!(
            changed_sources(&previous, &now),
            vec![
                ("/f1".to_string(), "removed"),
                ("/f2".to_string(), "rewritten")
            ]
        );
        assert!(changed_sources(&previous, &files).is_empty());
    }

    #[test]
    fn a_second_writer_is_refused_while_the_first_holds_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let first = WriterLock::take(dir.path()).unwrap();
        let err = WriterLock::take(dir.path()).err().unwrap().to_string();
        assert!(err.contains("another `sparse-knn index`"), "{err}");
        drop(first);
        WriterLock::take(dir.path()).unwrap();
    }

    #[test]
    fn only_segments_no_manifest_of_the_last_two_names_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            segment_name(1, 0),
            segment_name(2, 0),
            segment_name(3, 0),
            ".segment-000004-000.skidx.tmp-99".into(),
            "notes.txt".into(),
        ] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        let with = |files: &[String]| Manifest {
            generation: 0,
            input: String::new(),
            metrics: vec![],
            options: String::new(),
            segments: files
                .iter()
                .map(|f| SegmentEntry {
                    file: Some(f.clone()),
                    rows: 1,
                    sources: vec![],
                })
                .collect(),
        };
        remove_unused(
            dir.path(),
            &with(&[segment_name(3, 0)]),
            Some(&with(&[segment_name(2, 0)])),
        );
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        assert_eq!(
            names,
            vec![
                "notes.txt".to_string(),
                segment_name(2, 0),
                segment_name(3, 0)
            ]
        );
    }
}
