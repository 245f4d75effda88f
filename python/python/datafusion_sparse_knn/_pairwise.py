"""``pairwise_distances``: every distance between two sets of rows as a dense matrix, like
``sklearn.metrics.pairwise_distances`` (in its dtype), computed by the crate's semiring kernels."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ._inputs import _distance_dtype, _float_kind, _options, _rows
from ._internal import FittedIndex

__all__ = ["pairwise_distances"]


def _memory_available() -> int | None:
    """Bytes of memory available now (Linux: MemAvailable), None where it cannot be told."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _check_fits(rows: int, columns: int, dtype: np.dtype) -> None:
    # A float32 output is the float64 one rounded: both are alive while it is made.
    needed = rows * columns * (8 if dtype == np.float64 else 12)
    available = _memory_available()
    if available is not None and needed > available:
        msg = (
            f"pairwise_distances: the output, {rows} x {columns} {dtype} values, would take "
            f"{_gib(needed)}, more than the {_gib(available)} of memory available; pass fewer "
            "rows of X at a time, or ask for the nearest rows only (kneighbors, "
            "radius_neighbors, NearestNeighbors.kneighbors_graph)"
        )
        raise ValueError(msg)


def pairwise_distances(X: Any, Y: Any = None, metric: str = "cosine", **options: Any) -> np.ndarray:
    """The distance of every row of ``X`` to every row of ``Y`` (``Y=None``: ``X`` itself) as a
    dense array of shape (rows of X, rows of Y), like
    ``sklearn.metrics.pairwise_distances(X, Y, metric=metric)``, in its dtype: float32 where
    ``X`` and ``Y`` are float32 matrices and the metric is ``cosine`` or ``euclidean`` (``l2``),
    which scikit-learn's own kernels keep in float32, else float64 (computed in float64 either
    way).

    Computed by the crate's kernels in blocks of rows of ``X`` (on the GPU with
    ``device='gpu'``), written straight into the output: memory holds the output and, for the
    GPU and the metrics with union terms (chebyshev, minkowski, hellinger, jensenshannon), one
    block's pairs. ``X`` against itself (``Y=None``, or ``Y is X``) computes each pair once on
    the CPU and mirrors it (exactly symmetric; kl_divergence, not symmetric, computes both).
    An output larger than the memory available is a ``ValueError`` that says how
    large it would be. Inputs and options as in :class:`NearestNeighbors` (``p``, ``dim``,
    ``device``, ...); metrics: every metric of the SQL functions (for ``dot``, a similarity,
    the values are dot products).
    """
    x_rows, x_n, x_columns = _rows(X, "X")
    if Y is X:
        # The rows against themselves: converted once, and each pair computed once.
        Y = None
    kinds = [_float_kind(X)] + ([] if Y is None else [_float_kind(Y)])
    dtype = _distance_dtype(metric, options.get("p"), kinds, search=False)
    if Y is None:
        y_rows, y_n, y_columns = x_rows, x_n, x_columns
    else:
        y_rows, y_n, y_columns = _rows(Y, "Y")
        if x_columns is not None and y_columns is not None and x_columns != y_columns:
            msg = (
                f"Incompatible dimension for X and Y matrices: X.shape[1] == {x_columns} while "
                f"Y.shape[1] == {y_columns}"
            )
            raise ValueError(msg)
    if x_n is not None and y_n is not None:
        _check_fits(x_n, y_n, dtype)
    columns = x_columns if x_columns is not None else y_columns
    text = _options(metric, options, columns)
    # The index's distance matrix fills the output in place: on the CPU the folded metrics'
    # dense blocks, on the GPU its matrix kernel; the metrics whose distances come from union
    # terms (chebyshev, minkowski, hellinger, jensenshannon) from a probe within an infinite
    # radius.
    index = FittedIndex.fit(y_rows, metric, text)
    if x_n is None:
        _check_fits(index.n_rows if Y is None else _rows_of(x_rows), index.n_rows, dtype)
    return index.pairwise(None if Y is None else x_rows).astype(dtype, copy=False)


def _rows_of(rows) -> int:
    n = rows.num_rows
    return 0 if n is None else n
