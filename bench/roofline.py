#!/usr/bin/env python3
"""Roofline figures of a full self kNN join over a sparse Parquet file (issue 14, item 0).

The GPU kernels walk inverted lists: every left nonzero in column c meets every right nonzero in
c, so a self join walks sum_c n_c^2 list entries (n_c: column c's nonzeros) and finishes
rows^2 pairs. Moving each walked entry's 8 bytes (a u32 row, an f32 value) from HBM once, with
no reuse between left rows, is the memory bound printed at the H100's and H200's bandwidths;
the kernels reuse popular columns' lists from L2, so time below that bound is possible and time
far above it means the kernels are bound by something else (issue slots, atomics).

    python3 bench/roofline.py FILE.parquet [FILE.parquet ...]   # needs pyarrow and numpy
"""
import sys

import numpy as np
import pyarrow.parquet as pq

HBM = {"H100 (3.35 TB/s)": 3.35e12, "H200 (4.8 TB/s)": 4.8e12}


def column_counts(path):
    pf = pq.ParquetFile(path)
    counts = np.zeros(0, dtype=np.int64)
    rows = 0
    for batch in pf.iter_batches(columns=["vec"], batch_size=65536):
        vec = batch.column(0)
        idx = vec.field("indices").flatten().to_numpy(zero_copy_only=False)
        val = vec.field("values").flatten().to_numpy(zero_copy_only=False)
        idx = idx[val != 0]
        rows += len(vec)
        if len(idx):
            c = np.bincount(idx.astype(np.int64))
            if len(c) > len(counts):
                counts = np.pad(counts, (0, len(c) - len(counts)))
            counts[: len(c)] += c
    return rows, counts


def main(paths):
    print("| file | rows | nnz | sum_c n_c^2 (entries walked) | pairs finished | "
          + " | ".join(f"bytes at {k}" for k in HBM) + " |")
    print("|---|---|---|---|---|" + "---|" * len(HBM))
    for path in paths:
        rows, counts = column_counts(path)
        walked = float((counts.astype(np.float64) ** 2).sum())
        cells = [f"{walked * 8 / 1e9:.0f} GB: {walked * 8 / bw:.3f} s" for bw in HBM.values()]
        print(f"| {path.rsplit('/', 1)[-1]} | {rows:,} | {int(counts.sum()):,} | {walked:.3g} | "
              f"{float(rows) ** 2:.3g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
