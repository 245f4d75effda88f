"""Inputs of the package's functions: matrices, Arrow data and Parquet paths, turned into
``Source`` s (Arrow, for the one-shot joins) or ``Csr`` buffers (for a fitted index), and the
keyword options into the SQL options string."""

from __future__ import annotations

import numbers
import os
import sys
from typing import Any

import numpy as np
import pyarrow as pa

from ._internal import Csr, Source

# Metrics that need the dimension; for a matrix it is its number of columns, as in scikit-learn.
_NEEDS_DIM = {"hamming", "russellrao", "correlation"}

# scikit-learn (1.9) gives distances in float32 only where both sides are float32 and its own
# float32 kernels compute them: cosine, and euclidean (also minkowski with p=2, its effective
# metric) between sparse matrices. Its neighbour searches take ArgKmin / RadiusNeighbors
# (float64) for every other metric it has there, and for dense euclidean and for "l2" (the
# name has no "euclidean" in it); its pairwise_distances keep float32 for cosine, euclidean and
# l2; scipy's metrics, integer and mixed inputs give float64. The crate computes in float64; a
# float32 result is that rounded, which keeps each row's order (rounding is monotonic).
_FLOAT32_SEARCH = frozenset({"cosine"})
_FLOAT32_SPARSE_SEARCH = frozenset({"euclidean"})
_FLOAT32_PAIRWISE = frozenset({"cosine", "euclidean", "l2"})


def _float_kind(obj: Any) -> tuple[bool, bool]:
    """``(float32, sparse)`` of an input: whether it is a float32 matrix (scipy sparse or numpy;
    the one input scikit-learn answers in float32: Arrow data and Parquet files get the crate's
    float64), and whether it is a sparse one."""
    sparse = _scipy_sparse(obj)
    float32 = (sparse or isinstance(obj, np.ndarray)) and obj.dtype == np.float32
    return bool(float32), sparse


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _distance_dtype(
    metric: Any, p: Any, kinds: list[tuple[bool, bool]], *, search: bool = True
) -> np.dtype:
    """The dtype of scikit-learn's distances for ``metric`` (``p``: minkowski's, None: 2) between
    inputs of ``kinds`` (``_float_kind`` of each side): a neighbour search's (``search``) or
    ``pairwise_distances``'."""
    if not kinds or not all(float32 for float32, _ in kinds):
        return np.dtype(np.float64)
    name = metric.lower() if isinstance(metric, str) else ""
    if search:
        if name == "minkowski" and (p is None or _number(p) == 2.0):
            name = "euclidean"
        all_sparse = all(sparse for _, sparse in kinds)
        keeps = name in _FLOAT32_SEARCH or (all_sparse and name in _FLOAT32_SPARSE_SEARCH)
    else:
        keeps = name in _FLOAT32_PAIRWISE
    return np.dtype(np.float32) if keeps else np.dtype(np.float64)


def _scipy_sparse(obj: Any) -> bool:
    # Without scipy imported, obj cannot be one of its matrices; never import it for nothing.
    sparse = sys.modules.get("scipy.sparse")
    return sparse is not None and sparse.issparse(obj)


def _csr_source(
    indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, groups: Any = None
) -> Source:
    """The canonical vector column (plus ``row``, the row position, and ``group``, the rows'
    ``within=`` labels where given) over a CSR matrix's arrays: pyarrow wraps the numpy
    buffers, so nothing is copied in Python."""
    if indices.dtype != np.int32:
        # scipy uses int64 when a matrix is large; the join checks the values' range.
        indices = indices.astype(np.int64, copy=False)
    if data.dtype not in (np.float32, np.float64):
        data = data.astype(np.float64)
    nnz = int(indptr[-1]) if len(indptr) else 0
    if nnz < 2**31:
        offsets = pa.array(np.asarray(indptr, dtype=np.int32))
        list_array = pa.ListArray
    else:
        offsets = pa.array(np.asarray(indptr, dtype=np.int64))
        list_array = pa.LargeListArray
    vector = pa.StructArray.from_arrays(
        [
            list_array.from_arrays(offsets, pa.array(np.ascontiguousarray(indices[:nnz]))),
            list_array.from_arrays(offsets, pa.array(np.ascontiguousarray(data[:nnz]))),
        ],
        names=["indices", "values"],
    )
    rows = pa.array(np.arange(len(indptr) - 1, dtype=np.int64))
    columns = {"row": rows, "vector": vector}
    if groups is not None:
        columns[_GROUP_COLUMN] = groups
    return Source.from_arrow(pa.table(columns))


def _source(obj: Any, what: str, groups: Any = None) -> tuple[Source, int | None]:
    """A join input and, for a matrix, its number of columns. ``groups``: the rows' ``within=``
    labels (matrices only: Arrow data and Parquet files name a column instead)."""
    if groups is not None and not (_scipy_sparse(obj) or isinstance(obj, (np.ndarray, list, tuple))):
        msg = (
            f"within: labels go with a matrix; {what} is {type(obj).__name__}: name its column "
            f"instead (within='tenant')"
        )
        raise ValueError(msg)
    if isinstance(obj, Source):
        return obj, None
    if isinstance(obj, (str, os.PathLike)):
        return Source.from_parquet(os.fspath(obj)), None
    if _scipy_sparse(obj):
        if obj.ndim != 2:
            msg = f"{what}: expected a 2-D sparse matrix, got {obj.ndim} dimensions"
            raise ValueError(msg)
        csr = _canonical_csr(obj)
        labels = _labels(groups, csr.shape[0], what)
        return _csr_source(csr.indptr, csr.indices, csr.data, labels), csr.shape[1]
    if hasattr(obj, "__arrow_c_stream__"):
        return Source.from_arrow(obj), None
    if hasattr(obj, "__arrow_c_array__"):
        # A record batch (or a struct array of columns) that only speaks the array interface.
        return Source.from_arrow(pa.table(pa.record_batch(obj))), None
    if isinstance(obj, (np.ndarray, list, tuple)):
        dense = _dense(obj, what)
        indptr, cols, values = _dense_csr(dense)
        labels = _labels(groups, dense.shape[0], what)
        return _csr_source(indptr, cols, values, labels), dense.shape[1]
    msg = (
        f"{what}: expected a scipy.sparse matrix, a 2-D numpy array, Arrow data (a pyarrow Table "
        f"or RecordBatch, or any object with __arrow_c_stream__) or a Parquet path; "
        f"got {type(obj).__name__}"
    )
    raise ValueError(msg)


# The column that carries a matrix's within= labels.
_GROUP_COLUMN = "group"


def _labels(groups: Any, rows: int, what: str) -> pa.Array | None:
    """A matrix's ``within=`` labels as an Arrow array of one value a row (None: NULL, which
    matches nothing)."""
    if groups is None:
        return None
    try:
        labels = pa.array(groups.tolist() if isinstance(groups, np.ndarray) else groups)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
        msg = f"within: the labels of {what} are not one value a row: {e}"
        raise ValueError(msg) from None
    if len(labels) != rows:
        msg = f"within: {what} has {rows} rows but {len(labels)} labels"
        raise ValueError(msg)
    return labels


def _split_within(X: Any, Y: Any, options: dict[str, Any]) -> tuple[Any, Any]:
    """``within=`` of a call on matrices: labels of X's rows (``Y`` None: X is searched) or a
    pair (labels of X, labels of Y). Turned into the ``group`` column; a column name (Arrow data,
    Parquet) stays an option. Returns the labels of X and of Y (None where not given)."""
    within = options.get("within")
    if within is None or isinstance(within, str):
        return None, None
    del options["within"]
    if Y is None or Y is X:
        options["within"] = _GROUP_COLUMN
        return within, None
    if not (isinstance(within, (tuple, list)) and len(within) == 2):
        msg = (
            "within: with Y given, pass a pair (labels of X's rows, labels of Y's rows), or a "
            "column name for Arrow data or Parquet"
        )
        raise ValueError(msg)
    options["within"] = _GROUP_COLUMN
    return within[0], within[1]


def _option_text(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _options(metric: Any, options: dict[str, Any], features: int | None) -> str:
    """The SQL options string for keyword options; ``dim`` from the matrices where needed."""
    if not isinstance(metric, str):
        msg = f"metric must be a string, got {type(metric).__name__}"
        raise ValueError(msg)
    options = {k: v for k, v in options.items() if v is not None}
    if features is not None and "dim" not in options and metric.lower() in _NEEDS_DIM:
        options["dim"] = features
    return ", ".join(f"{key}={_option_text(key, value)}" for key, value in options.items())


def _inputs(
    X: Any, Y: Any, metric: Any, options: dict[str, Any]
) -> tuple[Source, Source | None, str]:
    options = dict(options)
    groups_x, groups_y = _split_within(X, Y, options)
    left, left_features = _source(X, "X", groups_x)
    if Y is None or Y is X:
        right, right_features = None, left_features
    else:
        right, right_features = _source(Y, "Y", groups_y)
    if left_features is not None and right_features is not None and left_features != right_features:
        msg = f"X has {left_features} columns but Y has {right_features}; they must be equal"
        raise ValueError(msg)
    features = left_features if left_features is not None else right_features
    return left, right, _options(metric, options, features)


def _check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        msg = f"k must be an integer >= 1, got {k!r}"
        raise ValueError(msg)
    return int(k)


def _check_radius(radius: Any) -> float:
    if isinstance(radius, bool) or not isinstance(radius, numbers.Real):
        msg = f"radius must be a number, got {radius!r}"
        raise ValueError(msg)
    return float(radius)


def _object_array(parts: list[np.ndarray]) -> np.ndarray:
    # Assigning a list of equal-length arrays at once would make numpy build a 2-D array.
    out = np.empty(len(parts), dtype=object)
    for i, part in enumerate(parts):
        out[i] = part
    return out


def _dense(obj: Any, what: str) -> np.ndarray:
    dense = np.asarray(obj)
    if dense.ndim != 2:
        msg = f"{what}: expected a 2-D array, got shape {dense.shape}"
        raise ValueError(msg)
    if dense.dtype.kind not in "biuf":
        msg = f"{what}: expected a numeric array, got dtype {dense.dtype}"
        raise ValueError(msg)
    return dense


def _dense_csr(dense: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A dense 2-D array's nonzeros as CSR arrays (zeros dropped)."""
    nonzero = dense != 0
    indptr = np.zeros(dense.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.count_nonzero(nonzero, axis=1), out=indptr[1:])
    rows, cols = np.nonzero(nonzero)
    return indptr, cols, dense[rows, cols]


def _canonical_csr(obj: Any):
    """A scipy matrix as a canonical CSR matrix: duplicates summed, stored zeros dropped."""
    csr = obj.tocsr()
    if not csr.has_canonical_format:
        # Duplicate entries are summed (scipy's meaning); unsorted ones would be fine.
        csr = csr.copy() if csr is obj else csr
        csr.sum_duplicates()
    if csr.nnz and not np.all(csr.data != 0):
        # Stored zeros are zeros: the set metrics (jaccard, dice, ...) must not count them.
        csr = csr.copy() if csr is obj else csr
        csr.eliminate_zeros()
    return csr


def _csr_rows(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, columns: int) -> Csr:
    """CSR arrays as bytes for the fitted index (one copy, no pyarrow objects: ~1 µs for a row)."""
    nnz = int(indptr[-1]) if len(indptr) else 0
    wide = columns > 2**31 - 1
    if data.dtype == np.float32:
        double = False
    else:
        data = data.astype(np.float64, copy=False)
        double = True
    return Csr(
        np.ascontiguousarray(indptr, dtype=np.int64).tobytes(),
        np.ascontiguousarray(indices[:nnz], dtype=np.int64 if wide else np.int32).tobytes(),
        np.ascontiguousarray(data[:nnz]).tobytes(),
        wide,
        double,
    )


def _rows(obj: Any, what: str) -> tuple[Csr | Source, int | None, int | None]:
    """Rows for a fitted index: ``(rows, number of rows or None, number of columns or None)``.
    Matrices go as CSR buffers, Arrow data as a ``Source``; a Parquet path is read here, so
    that its rows are counted."""
    if isinstance(obj, Source):
        return obj, obj.num_rows, None
    if _scipy_sparse(obj):
        if obj.ndim != 2:
            msg = f"{what}: expected a 2-D sparse matrix, got {obj.ndim} dimensions"
            raise ValueError(msg)
        csr = _canonical_csr(obj)
        return _csr_rows(csr.indptr, csr.indices, csr.data, csr.shape[1]), csr.shape[0], csr.shape[1]
    if isinstance(obj, (np.ndarray, list, tuple)):
        dense = _dense(obj, what)
        indptr, cols, values = _dense_csr(dense)
        return _csr_rows(indptr, cols, values, dense.shape[1]), dense.shape[0], dense.shape[1]
    if isinstance(obj, (str, os.PathLike)):
        import pyarrow.parquet as pq

        path = os.fspath(obj)
        if not os.path.exists(path):
            msg = f"'{path}' is not an existing Parquet file or folder"
            raise ValueError(msg)
        obj = pq.read_table(path)
    source, _ = _source(obj, what)
    return source, source.num_rows, None
