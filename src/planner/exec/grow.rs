//! A right side read from files, kept in segments (`index::segments`): on a cache miss, the
//! segments of the side's previous version whose files are unchanged are taken, and only the
//! files outside them are read and built, each run of them by the same build as a whole side
//! (`BuildJob::build_from` over the right plan restricted to those files). Adjacent small
//! segments are then merged on a task of their own, beside the statements.
//!
//! Only a right plan whose rows are its files' rows end to end is held so: one file scan under
//! row-by-row operators (projection, filter, batching), no limit, and no `exclude_self=COLUMN`
//! (whose key groups span the whole side).

use std::ops::Range;
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::Result;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfig, FileScanConfigBuilder};
use datafusion::datasource::source::DataSourceExec;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::physical_plan::{displayable, ExecutionPlan};

use super::build::{BuildJob, BuildMetrics};
use super::inputs_on_own_tasks;
use crate::index::{
    joined, merge_groups, reuse, FileStamp, IndexCache, KeptSide, Part, Segment, Segments,
};
use crate::options::ExcludeSelf;

/// Operators that pass their input's rows through one by one, in order.
const ROW_BY_ROW: [&str; 5] = [
    "GatherExec",
    "ProjectionExec",
    "FilterExec",
    "CoalesceBatchesExec",
    "CooperativeExec",
];

/// The right plan's one file scan, file by file.
pub(super) struct FileRuns {
    plan: Arc<dyn ExecutionPlan>,
    /// Each file's pieces as the plan reads them (a large file in byte ranges), in row order.
    files: Vec<Vec<PartitionedFile>>,
    /// The plan's text without its files, and the index's shape: what the versions of a
    /// growing side share.
    pub(super) shape: String,
}

impl FileRuns {
    /// `plan`'s files, where its rows are their rows end to end and `files` (the identity's
    /// stamps) are those files; None otherwise.
    pub(super) fn of(
        plan: &Arc<dyn ExecutionPlan>,
        files: &[FileStamp],
        build_shape: &str,
        exclude_self: &ExcludeSelf,
    ) -> Option<Self> {
        if matches!(exclude_self, ExcludeSelf::Column(_)) {
            return None;
        }
        let mut node = plan;
        let config = loop {
            match node.children().as_slice() {
                [child] if ROW_BY_ROW.contains(&node.name()) => node = child,
                [] => {
                    let source = node.downcast_ref::<DataSourceExec>()?;
                    break source.data_source().downcast_ref::<FileScanConfig>()?;
                }
                _ => return None,
            }
        };
        if config.limit.is_some() {
            return None;
        }
        let mut runs: Vec<Vec<PartitionedFile>> = Vec::new();
        for file in config.file_groups.iter().flat_map(|g| g.iter()) {
            match runs.last_mut() {
                Some(run) if run[0].object_meta.location == file.object_meta.location => {
                    run.push(file.clone())
                }
                _ => runs.push(vec![file.clone()]),
            }
        }
        let same_files = runs.len() == files.len()
            && runs
                .iter()
                .zip(files)
                .all(|(run, stamp)| run[0].object_meta.location.as_ref() == stamp.location());
        if runs.is_empty() || !same_files {
            return None;
        }
        let without_files = restrict(plan, Vec::new()).ok()?;
        let shape = format!(
            "{}\n{build_shape}",
            displayable(without_files.as_ref()).indent(true)
        );
        Some(Self {
            plan: Arc::clone(plan),
            files: runs,
            shape,
        })
    }

    /// The plan reading only files `files`, their pieces in at most `partitions` partitions.
    pub(super) fn restricted(
        &self,
        files: Range<usize>,
        partitions: usize,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let pieces: Vec<PartitionedFile> = self.files[files].iter().flatten().cloned().collect();
        let per_group = pieces.len().div_ceil(partitions.max(1)).max(1);
        let groups = pieces
            .chunks(per_group)
            .map(|c| FileGroup::new(c.to_vec()))
            .collect();
        restrict(&self.plan, groups)
    }
}

/// `plan` with its file scan reading `groups`.
fn restrict(
    plan: &Arc<dyn ExecutionPlan>,
    groups: Vec<FileGroup>,
) -> Result<Arc<dyn ExecutionPlan>> {
    Arc::clone(plan)
        .transform_up(|node| {
            let config = node
                .downcast_ref::<DataSourceExec>()
                .and_then(|s| s.data_source().downcast_ref::<FileScanConfig>());
            Ok(match config {
                Some(config) => Transformed::yes(DataSourceExec::from_data_source(
                    FileScanConfigBuilder::from(config.clone())
                        .with_file_groups(groups.clone())
                        .build(),
                ) as Arc<dyn ExecutionPlan>),
                None => Transformed::no(node),
            })
        })
        .map(|t| t.data)
}

impl BuildJob {
    /// The side over `files` (the identity's stamps, `runs`' files) from the segments of its
    /// previous version in `cache`: the unchanged ones taken, the rest built. A side with no
    /// previous version, or none of whose segments is unchanged, is built whole (one segment).
    pub(super) async fn build_in_segments(
        &mut self,
        cache: &IndexCache,
        runs: &FileRuns,
        files: &[FileStamp],
    ) -> Result<(Arc<KeptSide>, Arc<Segments>)> {
        let previous = cache.segments_for(&runs.shape);
        let parts = reuse(&previous, files);
        let whole = !parts.iter().any(|p| matches!(p, Part::Kept(_)));
        let mut list = Vec::with_capacity(parts.len());
        for part in parts {
            match part {
                Part::Kept(segment) => {
                    self.metrics.reused.add(1);
                    self.metrics.rows.add(segment.side.rows);
                    list.push(segment);
                }
                Part::Build(range) if whole => {
                    let side = Arc::new(self.build().await?);
                    list.push(Segment {
                        files: files[range].to_vec(),
                        side,
                    });
                }
                Part::Build(range) => {
                    let plan = runs.restricted(range.clone(), self.partitions())?;
                    let side = Arc::new(self.build_from(plan).await?);
                    list.push(Segment {
                        files: files[range].to_vec(),
                        side,
                    });
                }
            }
        }
        // Every segment kept (files removed): the left read-ahead may start now.
        if let Some(read) = self.right_read.take() {
            let _ = read.send(());
        }
        let side = self.join_segments(&list)?;
        let segments = Arc::new(Segments {
            shape: runs.shape.clone(),
            list,
        });
        log::debug!(
            "{}: the right side in {} segments ({} rows)",
            self.name,
            segments.list.len(),
            side.rows
        );
        Ok((side, segments))
    }

    fn partitions(&self) -> usize {
        self.context.session_config().target_partitions()
    }

    fn join_segments(&self, list: &[Segment]) -> Result<Arc<KeptSide>> {
        let sides: Vec<Arc<KeptSide>> = list.iter().map(|s| Arc::clone(&s.side)).collect();
        match sides.as_slice() {
            [one] => Ok(Arc::clone(one)),
            _ => Ok(Arc::new(joined(
                &sides,
                self.spec.metric.kind.is_similarity(),
                &self.context.memory_pool().clone(),
                self.name,
            )?)),
        }
    }

    /// Merges `segments`' small neighbours (`index::merge_groups`) on a task of its own, then
    /// puts the merged side in the cache in place of this one (while it still holds this one).
    /// Nothing when there is nothing to merge, a merge of this side runs, or the inputs are
    /// polled in place (datafusion-python: no task outlives the statement).
    pub(super) fn merge_later(
        &self,
        cache: Arc<IndexCache>,
        segments: Arc<Segments>,
        runs: FileRuns,
    ) {
        let rows: Vec<usize> = segments.list.iter().map(|s| s.side.rows).collect();
        let groups = merge_groups(&rows);
        if groups.is_empty()
            || !inputs_on_own_tasks()
            || tokio::runtime::Handle::try_current().is_err()
        {
            return;
        }
        let Some(guard) = cache.begin_merge(&segments.shape) else {
            return;
        };
        let mut job = BuildJob {
            right_read: None,
            keep_input: self.keep_input,
            name: self.name,
            spec: Arc::clone(&self.spec),
            device: self.device,
            right: Arc::clone(&self.right),
            right_mask: None,
            mask_over_kept: None,
            layout: self.layout.clone(),
            context: Arc::clone(&self.context),
            metrics: BuildMetrics::new(&ExecutionPlanMetricsSet::new()),
        };
        tokio::spawn(async move {
            let _merging = guard;
            let started = std::time::Instant::now();
            match job.merge(&segments, &runs, &groups).await {
                Ok(Merged(side, merged)) => {
                    let (before, after) = (segments.list.len(), merged.list.len());
                    let replaced = cache.replace_merged(&segments, side, merged);
                    log::debug!(
                        "{}: merged the right side's {before} segments into {after} in {:?}{}",
                        job.name,
                        started.elapsed(),
                        if replaced {
                            ""
                        } else {
                            " (a newer version came first: dropped)"
                        }
                    );
                }
                Err(e) => log::warn!(
                    "{}: merging the right side's segments failed (they stay as they are): {e}",
                    job.name
                ),
            }
        });
    }

    /// `segments` with each of `groups` (ranges of segments) built again as one.
    async fn merge(
        &mut self,
        segments: &Segments,
        runs: &FileRuns,
        groups: &[Range<usize>],
    ) -> Result<Merged> {
        let mut list = Vec::new();
        let mut next = 0;
        for group in groups {
            list.extend(segments.list[next..group.start].iter().cloned());
            let plan = runs.restricted(segments.file_range(group.clone()), self.partitions())?;
            let side = Arc::new(self.build_from(plan).await?);
            list.push(Segment {
                files: segments.list[group.clone()]
                    .iter()
                    .flat_map(|s| s.files.iter().cloned())
                    .collect(),
                side,
            });
            next = group.end;
        }
        list.extend(segments.list[next..].iter().cloned());
        let side = self.join_segments(&list)?;
        Ok(Merged(
            side,
            Arc::new(Segments {
                shape: segments.shape.clone(),
                list,
            }),
        ))
    }
}

/// A merged side and its segments.
struct Merged(Arc<KeptSide>, Arc<Segments>);
