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
use datafusion::datasource::physical_plan::{
    FileGroup, FileGroupPartitioner, FileScanConfig, FileScanConfigBuilder,
};
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
    /// The plan's files in row order, whole (the plan reads a large one in byte ranges, cut for
    /// all its files).
    files: Vec<PartitionedFile>,
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
        let whole = scan_files(plan)?;
        let same_files = whole.len() == files.len()
            && whole
                .iter()
                .zip(files)
                .all(|(file, stamp)| file.object_meta.location.as_ref() == stamp.location());
        if whole.is_empty() || !same_files {
            return None;
        }
        let without_files = restrict(plan, Vec::new()).ok()?;
        let shape = format!(
            "{}\n{build_shape}",
            displayable(without_files.as_ref()).indent(true)
        );
        Some(Self {
            plan: Arc::clone(plan),
            files: whole,
            shape,
        })
    }
}

/// `plan`'s files whole, in row order, where its rows are their rows end to end: one file scan
/// under row-by-row operators, no limit (what a side or an index folder keeps in segments).
pub(crate) fn scan_files(plan: &Arc<dyn ExecutionPlan>) -> Option<Vec<PartitionedFile>> {
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
    let mut whole: Vec<PartitionedFile> = Vec::new();
    for file in config.file_groups.iter().flat_map(|g| g.iter()) {
        if whole.last().map(|f| &f.object_meta.location) != Some(&file.object_meta.location) {
            let mut file = file.clone();
            file.range = None;
            whole.push(file);
        }
    }
    Some(whole)
}

/// `plan` reading only the whole files `files`, cut in byte ranges over `partitions` partitions
/// as DataFusion cuts a scan (in order: the ranges end to end are the files' rows). The ranges the
/// whole side's plan read them in were cut for all its files: there a new file may be one range,
/// read by one core.
pub(crate) fn plan_of_files(
    plan: &Arc<dyn ExecutionPlan>,
    files: Vec<PartitionedFile>,
    partitions: usize,
    min_range_bytes: usize,
) -> Result<Arc<dyn ExecutionPlan>> {
    let groups = FileGroupPartitioner::new()
        .with_target_partitions(partitions.max(1))
        .with_repartition_file_min_size(min_range_bytes)
        .repartition_file_groups(&[FileGroup::new(files.clone())])
        .unwrap_or_else(|| {
            let per_group = files.len().div_ceil(partitions.max(1)).max(1);
            files
                .chunks(per_group)
                .map(|c| FileGroup::new(c.to_vec()))
                .collect()
        });
    restrict(plan, groups)
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
                Part::Build(range) => {
                    let scan_files = runs.files[range.clone()].to_vec();
                    let side = if whole {
                        self.build().await?
                    } else {
                        let plan = plan_of_files(
                            &runs.plan,
                            scan_files.clone(),
                            self.partitions(),
                            self.min_range_bytes(),
                        )?;
                        self.build_from(plan).await?
                    };
                    list.push(Segment {
                        files: files[range].to_vec(),
                        scan_files,
                        side: Arc::new(side),
                    });
                }
            }
        }
        // A merge that ended while the new files were built: its segments where they fit (else
        // this version, made from the one before the merge, would replace the merged one).
        let mut held = cache.segments_for(&runs.shape);
        held.push(Arc::new(Segments {
            shape: runs.shape.clone(),
            plan: Arc::clone(&runs.plan),
            list: list.clone(),
        }));
        let parts = reuse(&held, files);
        if parts.len() < list.len() && parts.iter().all(|p| matches!(p, Part::Kept(_))) {
            list = parts
                .into_iter()
                .filter_map(|p| match p {
                    Part::Kept(segment) => Some(segment),
                    Part::Build(_) => None,
                })
                .collect();
        }
        // Every segment kept (files removed): the left read-ahead may start now.
        if let Some(read) = self.right_read.take() {
            let _ = read.send(());
        }
        let side = self.join_segments(&list)?;
        let segments = Arc::new(Segments {
            shape: runs.shape.clone(),
            plan: Arc::clone(&runs.plan),
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

    fn min_range_bytes(&self) -> usize {
        self.context
            .session_config()
            .options()
            .optimizer
            .repartition_file_min_size
    }

    fn join_segments(&self, list: &[Segment]) -> Result<Arc<KeptSide>> {
        let sides: Vec<Arc<KeptSide>> = list.iter().map(|s| Arc::clone(&s.side)).collect();
        match sides.as_slice() {
            [one] => Ok(Arc::clone(one)),
            _ => Ok(Arc::new(joined(
                &sides,
                self.spec.metric.kind.is_similarity(),
                self.context.memory_pool(),
                self.name,
            )?)),
        }
    }

    /// Merges the small neighbours (`index::merge_groups`) of the newest held version of the side
    /// of `shape` on a task of its own, round after round until none is left to merge: each round's
    /// merged segments are grafted into the version held when it ends (statements that grew the
    /// side meanwhile made newer versions of the same segments). Nothing when a merge of this side
    /// runs, or the inputs are polled in place (datafusion-python: no task outlives a statement).
    pub(super) fn merge_later(&self, cache: Arc<IndexCache>, shape: String) {
        let needed = cache
            .newest_segments(&shape)
            .is_some_and(|n| !merge_groups(&rows_of(&n)).is_empty());
        if !needed || !inputs_on_own_tasks() || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let Some(guard) = cache.begin_merge(&shape) else {
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
            for _ in 0..MERGE_ROUNDS {
                let Some(latest) = cache.newest_segments(&shape) else {
                    return;
                };
                let groups = merge_groups(&rows_of(&latest));
                if groups.is_empty() {
                    return;
                }
                let started = std::time::Instant::now();
                let merged = match job.merge(&latest, &groups).await {
                    Ok(merged) => merged,
                    Err(e) => {
                        log::warn!(
                            "{}: merging the right side's segments failed (they stay as they \
                             are): {e}",
                            job.name
                        );
                        return;
                    }
                };
                // Grafted into the newest version; tried again if a statement replaced it
                // between the look and the swap.
                for _ in 0..3 {
                    let Some(target) = cache.newest_segments(&shape) else {
                        return;
                    };
                    let Some(list) = target.grafted(&merged) else {
                        break;
                    };
                    let (before, after) = (target.list.len(), list.len());
                    let side = match job.join_segments(&list) {
                        Ok(side) => side,
                        Err(e) => {
                            log::warn!("{}: joining merged segments failed: {e}", job.name);
                            return;
                        }
                    };
                    let segments = Arc::new(Segments {
                        shape: shape.clone(),
                        plan: Arc::clone(&target.plan),
                        list,
                    });
                    if cache.replace_merged(&target, side, segments) {
                        log::debug!(
                            "{}: merged the right side's {before} segments into {after} in {:?}",
                            job.name,
                            started.elapsed()
                        );
                        break;
                    }
                }
            }
        });
    }

    /// The segments of each of `groups` (ranges of `segments.list`) built again as one: for each,
    /// the sides it replaces and the merged segment.
    async fn merge(
        &mut self,
        segments: &Segments,
        groups: &[Range<usize>],
    ) -> Result<Vec<(Vec<Arc<KeptSide>>, Segment)>> {
        let mut merged = Vec::with_capacity(groups.len());
        for group in groups {
            let members = &segments.list[group.clone()];
            let scan_files: Vec<PartitionedFile> = members
                .iter()
                .flat_map(|s| s.scan_files.iter().cloned())
                .collect();
            let plan = plan_of_files(
                &segments.plan,
                scan_files.clone(),
                self.partitions(),
                self.min_range_bytes(),
            )?;
            let side = Arc::new(self.build_from(plan).await?);
            merged.push((
                members.iter().map(|s| Arc::clone(&s.side)).collect(),
                Segment {
                    files: members
                        .iter()
                        .flat_map(|s| s.files.iter().cloned())
                        .collect(),
                    scan_files,
                    side,
                },
            ));
        }
        Ok(merged)
    }
}

/// Merge rounds a merge task runs at most (each merges what the newest version needs).
const MERGE_ROUNDS: usize = 64;

fn rows_of(segments: &Segments) -> Vec<usize> {
    segments.list.iter().map(|s| s.side.rows).collect()
}
