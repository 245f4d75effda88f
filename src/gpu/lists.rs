//! The right side's inverted lists built on the device: the part's CSR goes up as it is (the
//! same bytes as the lists) and five small kernels turn it into the tile pointers and the list
//! entries the folded kernels read (`list_count`, `list_scan_*`, `list_fill` in kernels/dense.cu),
//! where the host's build was the largest step of a right side's preparation (75 of 150 ms at
//! the movielens shape on 16 cores, call BR). The host build ([`super::prepare::prepare_part`])
//! stays for parts streamed per probe.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use datafusion::common::{exec_err, Result};

use super::args::ListArgs;
use super::device::{cuda_err, Device};
use super::kernels::MetricProgram;
use super::memory::{addr, upload, zeros};
use super::prepare::{ColumnMap, DevPart, HostPart};
use super::stats::GpuStats;
use crate::vector::SparseBatch;

/// Counts each thread of the scan kernels adds (`LIST_SCAN_ITEMS`), and their block size.
const SCAN_ITEMS: usize = 4;
const SCAN_THREADS: usize = 1024;

/// How the lists of a part held whole on the device are built (`SPARSE_KNN_GPU_LISTS`, for
/// comparing the two: `host` or `device`; by default on the device where its scratch fits).
pub(crate) fn on_device_allowed() -> bool {
    match std::env::var("SPARSE_KNN_GPU_LISTS").as_deref() {
        Ok("host") => false,
        Ok("device") | Err(_) => true,
        Ok(other) => {
            log::warn!("SPARSE_KNN_GPU_LISTS={other:?} is neither `host` nor `device`: ignored");
            true
        }
    }
}

/// What the build needs beside the part: the rows it comes from and how they are cut.
pub(crate) struct ListSource<'a> {
    pub(crate) right: &'a SparseBatch,
    pub(crate) columns: &'a ColumnMap,
    /// The sorted column ids on the device ([`ColumnMap::Sorted`]); None for direct ids.
    pub(crate) col_ids: Option<&'a CudaSlice<i32>>,
    pub(crate) tile_rows: usize,
    /// The part's CSR, when it went up while the host prepared the part ([`upload_rows`]).
    pub(crate) rows: Option<&'a RowsOnDevice>,
}

/// A part's CSR on the device: its row pointers from the part's first entry, indices and values.
pub(crate) struct RowsOnDevice {
    first_row: usize,
    rows: usize,
    offsets: CudaSlice<u32>,
    indices: CudaSlice<i32>,
    values: CudaSlice<f32>,
}

/// Rows `start..end` of `right` as they are, to the device. Nothing on the device reads them
/// before the part is prepared and its lists are built (after the rows' checks), so a build
/// runs this beside the host's preparation: the copy of an 11M-row right side (17 GB) took as
/// long as that preparation and the checks together.
pub(crate) fn upload_rows(
    device: &Device,
    right: &SparseBatch,
    start: usize,
    end: usize,
    stats: &mut GpuStats,
) -> Result<RowsOnDevice> {
    let offsets = &right.offsets()[start..=end];
    let (o0, o1) = (offsets[0] as usize, offsets[end - start] as usize);
    // Row pointers from the part's first entry (u32: a part's entries are addressed in 32 bits,
    // `check_size`); on this thread, which runs beside the host's preparation (a parallel map
    // queued behind that work waited for it).
    let r_off: Vec<u32> = offsets.iter().map(|&o| (o as usize - o0) as u32).collect();
    Ok(RowsOnDevice {
        first_row: start,
        rows: end - start,
        offsets: upload(device, &r_off, stats)?,
        indices: upload(device, &right.indices()[o0..o1], stats)?,
        values: upload(device, &right.values()[o0..o1], stats)?,
    })
}

/// Device bytes the build holds beside the part's own buffers, for rows `start..end`: the CSR
/// (and a max's ranks in its order), the counters and the scan's block sums.
pub(crate) fn scratch_bytes(
    right: &SparseBatch,
    start: usize,
    end: usize,
    ncols: usize,
    ntiles: usize,
    max: bool,
) -> u64 {
    let nnz = (right.offsets()[end] - right.offsets()[start]) as u64;
    let counters = (ncols * (ntiles + 1)) as u64;
    nnz * (8 + max as u64)
        + (end - start + 1) as u64 * 4
        + counters * 4
        + counters / SCAN_ITEMS as u64
        + 64
}

/// The lists the device built.
pub(crate) struct BuiltLists {
    pub(crate) tile_ptr: CudaSlice<u32>,
    pub(crate) col_entries: CudaSlice<u64>,
    /// A max: each entry's rank in its row, beside it.
    pub(crate) col_ranks: Option<CudaSlice<u8>>,
}

/// The tile pointers and list entries (and a max's ranks) of `host`, prepared without them,
/// built on the device from the CSR of its rows.
pub(crate) fn build(
    device: &Device,
    program: &MetricProgram,
    host: &HostPart,
    dev: &DevPart,
    source: &ListSource<'_>,
    stats: &mut GpuStats,
) -> Result<BuiltLists> {
    let lists = host
        .device_lists
        .expect("a part prepared for lists built on the device");
    let (start, rows) = (host.first_row, host.rows);
    let uploaded_here;
    let csr = match source.rows {
        Some(csr) if (csr.first_row, csr.rows) == (start, rows) => csr,
        _ => {
            uploaded_here = upload_rows(device, source.right, start, start + rows, stats)?;
            &uploaded_here
        }
    };
    let ncols = source.columns.len();
    let n = ncols * (host.ntiles + 1);
    let nblocks = n.div_ceil(SCAN_ITEMS * SCAN_THREADS).max(1);
    let cursor = zeros::<u32>(device, n)?;
    let block_sums = zeros::<u32>(device, nblocks)?;
    let tile_ptr = zeros::<u32>(device, n)?;
    let col_entries = zeros::<u64>(device, lists.entries)?;
    let ranks = if host.entry_ranks.is_empty() {
        None
    } else {
        Some((
            upload(device, &host.entry_ranks, stats)?,
            zeros::<u8>(device, lists.entries)?,
        ))
    };
    let args = ListArgs {
        r_off: addr(device, &csr.offsets),
        r_idx: addr(device, &csr.indices),
        r_val: addr(device, &csr.values),
        valid_bits: if dev.all_valid {
            0
        } else {
            addr(device, &dev.valid_bits)
        },
        rows: rows as i32,
        tile_rows: source.tile_rows as i32,
        ntiles: host.ntiles as i32,
        col_mode: matches!(source.columns, ColumnMap::Sorted(_)) as i32,
        ncols: ncols as i32,
        // (read only for sorted ids)
        col_ids: source.col_ids.map_or(0, |ids| addr(device, ids)),
        cursor: addr(device, &cursor),
        n: n as i64,
        block_sums: addr(device, &block_sums),
        nblocks: nblocks as i64,
        tile_ptr: addr(device, &tile_ptr),
        col_entries: addr(device, &col_entries),
        r_rank: ranks.as_ref().map_or(0, |(r, _)| addr(device, r)),
        col_ranks: ranks.as_ref().map_or(0, |(_, c)| addr(device, c)),
    };
    // A warp per row, 8 a block, the grid striding over the rest.
    let per_row = LaunchConfig {
        grid_dim: (rows.div_ceil(8).clamp(1, 1 << 16) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let scan = |blocks: usize| LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (SCAN_THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    for (name, cfg) in [
        ("list_count", per_row),
        ("list_scan_sums", scan(nblocks)),
        ("list_scan_blocks", scan(1)),
        ("list_scan_apply", scan(nblocks)),
        ("list_fill", per_row),
    ] {
        let f = device.function(program, name, 0)?;
        let mut b = device.stream.launch_builder(&f);
        b.arg(&args);
        // SAFETY: `ListArgs` is the kernels' one parameter (its CUDA twin generated from it);
        // every row pointer is within the uploaded CSR, every column of the part is in the
        // map, every (column, tile) counter below n, and the counts sum to the entries
        // allocated (the host counted the same nonzeros); the buffers outlive the launches
        // (the stream is synchronised below before they are dropped).
        unsafe { b.launch(cfg) }.map_err(cuda_err("launching the kernel"))?;
    }
    // The last pointer is the number of entries placed: a check that the host's count, which
    // sized the entries, and the device's agree (the copy also waits for the kernels).
    let placed = device
        .stream
        .clone_dtoh(&tile_ptr.slice(n - 1..n))
        .map_err(cuda_err("copying from the device"))?;
    if placed[0] as usize != lists.entries {
        return exec_err!(
            "GPU: the inverted lists built on the device hold {} entries, {} expected",
            placed[0],
            lists.entries
        );
    }
    Ok(BuiltLists {
        tile_ptr,
        col_entries,
        col_ranks: ranks.map(|(_, c)| c),
    })
}
