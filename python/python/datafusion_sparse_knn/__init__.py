"""Exact nearest neighbours over sparse vectors, from Python.

Two ways in:

* ``register(ctx)`` adds every function of the Rust crate ``datafusion-sparse-knn`` to a
  ``datafusion.SessionContext`` (datafusion-python 55), so SQL such as
  ``SELECT * FROM knn_join('docs', 'docs', 'cosine', 10)`` runs in that session.
* ``kneighbors``, ``radius_neighbors``, ``knn_join`` and ``radius_join`` need no DataFusion in
  Python: they take ``scipy.sparse`` matrices, dense 2-D numpy arrays, Arrow data (a pyarrow
  Table or RecordBatch, or any object with ``__arrow_c_stream__``) or Parquet paths.

Every SQL option (``p``, ``dim``, ``device``, ``exclude_self``, ``left_column``, ``right_column``,
``gpu_memory_limit``) is a keyword argument; ``device`` is ``'auto'`` (a CUDA GPU when there is
one), ``'cpu'`` or ``'gpu'``. Bad input raises ``ValueError`` with the Rust error's message.
"""

from __future__ import annotations

import numbers
import os
import sys
from typing import Any

import numpy as np
import pyarrow as pa

from . import _internal
from ._internal import Source, __version__

__all__ = [
    "__version__",
    "Source",
    "kneighbors",
    "knn_join",
    "radius_join",
    "radius_neighbors",
    "register",
    "scalar_functions",
    "table_functions",
]

# Metrics that need the dimension; for a matrix it is its number of columns, as in scikit-learn.
_NEEDS_DIM = {"hamming", "russellrao", "correlation"}


def scalar_functions() -> list:
    """The scalar functions as datafusion-ffi exportables (``__datafusion_scalar_udf__``)."""
    return _internal.scalar_functions()


def table_functions() -> list:
    """``knn_join`` / ``radius_join`` as exportables (``__datafusion_table_function__``)."""
    return _internal.table_functions()


def register(ctx: Any) -> None:
    """Register every scalar function and the ``knn_join`` / ``radius_join`` table functions on a
    ``datafusion.SessionContext``.

    The table functions take table names of that session or Parquet paths, as strings::

        ctx.register_parquet("docs", "docs.parquet")
        datafusion_sparse_knn.register(ctx)
        ctx.sql("SELECT * FROM knn_join('docs', 'docs', 'cosine', 10, 'exclude_self=true')")
    """
    try:
        from datafusion.user_defined import ScalarUDF, TableFunction
    except ImportError as e:  # pragma: no cover - depends on the environment
        msg = "register(ctx) needs datafusion-python 55 (pip install 'datafusion==55.*')"
        raise ImportError(msg) from e
    if not (hasattr(ctx, "register_udf") and hasattr(ctx, "register_udtf")):
        msg = f"register: expected a datafusion.SessionContext, got {type(ctx).__name__}"
        raise TypeError(msg)
    for function in _internal.scalar_functions():
        ctx.register_udf(ScalarUDF(function.name, function))
    for function in _internal.table_functions():
        ctx.register_udtf(TableFunction(function.name, function, ctx))


def _scipy_sparse(obj: Any) -> bool:
    # Without scipy imported, obj cannot be one of its matrices; never import it for nothing.
    sparse = sys.modules.get("scipy.sparse")
    return sparse is not None and sparse.issparse(obj)


def _csr_source(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray) -> Source:
    """The canonical vector column (plus ``row``, the row position) over a CSR matrix's arrays:
    pyarrow wraps the numpy buffers, so nothing is copied in Python."""
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
    return Source.from_arrow(pa.table({"row": rows, "vector": vector}))


def _source(obj: Any, what: str) -> tuple[Source, int | None]:
    """A join input and, for a matrix, its number of columns."""
    if isinstance(obj, Source):
        return obj, None
    if isinstance(obj, (str, os.PathLike)):
        return Source.from_parquet(os.fspath(obj)), None
    if _scipy_sparse(obj):
        if obj.ndim != 2:
            msg = f"{what}: expected a 2-D sparse matrix, got {obj.ndim} dimensions"
            raise ValueError(msg)
        csr = obj.tocsr()
        if not csr.has_canonical_format:
            # Duplicate entries are summed (scipy's meaning); unsorted ones would be fine.
            csr = csr.copy() if csr is obj else csr
            csr.sum_duplicates()
        if csr.nnz and not np.all(csr.data != 0):
            # Stored zeros are zeros: the set metrics (jaccard, dice, ...) must not count them.
            csr = csr.copy() if csr is obj else csr
            csr.eliminate_zeros()
        return _csr_source(csr.indptr, csr.indices, csr.data), csr.shape[1]
    if hasattr(obj, "__arrow_c_stream__"):
        return Source.from_arrow(obj), None
    if hasattr(obj, "__arrow_c_array__"):
        # A record batch (or a struct array of columns) that only speaks the array interface.
        return Source.from_arrow(pa.table(pa.record_batch(obj))), None
    if isinstance(obj, (np.ndarray, list, tuple)):
        dense = np.asarray(obj)
        if dense.ndim != 2:
            msg = f"{what}: expected a 2-D array, got shape {dense.shape}"
            raise ValueError(msg)
        if dense.dtype.kind not in "biuf":
            msg = f"{what}: expected a numeric array, got dtype {dense.dtype}"
            raise ValueError(msg)
        nonzero = dense != 0
        indptr = np.zeros(dense.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.count_nonzero(nonzero, axis=1), out=indptr[1:])
        rows, cols = np.nonzero(nonzero)
        return _csr_source(indptr, cols, dense[rows, cols]), dense.shape[1]
    msg = (
        f"{what}: expected a scipy.sparse matrix, a 2-D numpy array, Arrow data (a pyarrow Table "
        f"or RecordBatch, or any object with __arrow_c_stream__) or a Parquet path; "
        f"got {type(obj).__name__}"
    )
    raise ValueError(msg)


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
    left, left_features = _source(X, "X")
    if Y is None or Y is X:
        right, right_features = None, left_features
    else:
        right, right_features = _source(Y, "Y")
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


def kneighbors(
    X: Any,
    Y: Any = None,
    k: int = 10,
    metric: str = "cosine",
    *,
    return_distance: bool = True,
    **options: Any,
) -> tuple[np.ndarray, np.ndarray] | np.ndarray:
    """For each row of ``X``, its ``k`` nearest rows of ``Y``, like scikit-learn's
    ``NearestNeighbors(n_neighbors=k, metric=metric, algorithm='brute').fit(Y).kneighbors(X)``.

    Args:
        X: the query rows: a ``scipy.sparse`` matrix, a dense 2-D array, Arrow data with one
            sparse-vector column (or ``left_column=``), or a Parquet path.
        Y: the rows searched, of the same kinds; ``None`` searches ``X`` itself (each row's own
            pair included, as scikit-learn does when ``X`` is passed explicitly; pass
            ``exclude_self=True`` to skip it).
        k: neighbours per row, at most the rows of ``Y``.
        metric: any metric of the SQL functions (``cosine``, ``euclidean``, ``manhattan``,
            ``minkowski`` with ``p=``, ``jaccard``, ``jensenshannon``, ...). For a matrix,
            ``dim`` defaults to its number of columns.
        return_distance: as in scikit-learn; ``False`` returns the indices only.
        **options: the SQL options: ``p``, ``dim``, ``device='auto'|'cpu'|'gpu'``,
            ``exclude_self``, ``left_column``, ``right_column``, ``gpu_memory_limit``.

    Returns:
        ``(distances, indices)``: float64 and int64 arrays of shape (rows of X, k), nearest first
        (for ``dot``, a similarity, largest first); ties go to the earlier row of ``Y``. A slot
        left empty (a NULL vector has no neighbours) has distance NaN and index -1.
    """
    k = _check_k(k)
    left, right, text = _inputs(X, Y, metric, options)
    rows, stream = _internal.kneighbors(left, right, metric, k, text)
    table = _table(stream)
    indices = _numpy(table, "index").reshape(rows, k)
    if not return_distance:
        return indices
    return _numpy(table, "distance").reshape(rows, k), indices


def _table(stream: Any) -> pa.Table:
    return pa.RecordBatchReader.from_stream(stream).read_all()


def _numpy(table: pa.Table, column: str) -> np.ndarray:
    # Writable, like scikit-learn's results (a zero-copy view of Arrow memory is read-only).
    return table.column(column).combine_chunks().to_numpy(zero_copy_only=False, writable=True)


def _object_array(parts: list[np.ndarray]) -> np.ndarray:
    # Assigning a list of equal-length arrays at once would make numpy build a 2-D array.
    out = np.empty(len(parts), dtype=object)
    for i, part in enumerate(parts):
        out[i] = part
    return out


def radius_neighbors(
    X: Any,
    Y: Any = None,
    radius: float = 1.0,
    metric: str = "cosine",
    *,
    return_distance: bool = True,
    **options: Any,
) -> tuple[np.ndarray, np.ndarray] | np.ndarray:
    """For each row of ``X``, every row of ``Y`` within ``radius`` (for ``dot``: at least
    ``radius``), like scikit-learn's ``NearestNeighbors(radius=radius, metric=metric,
    algorithm='brute').fit(Y).radius_neighbors(X)``.

    Inputs and options as in :func:`kneighbors`. Returns ``(distances, indices)``: object arrays
    with one float64 / int64 array per row of ``X``, nearest first.
    """
    radius = _check_radius(radius)
    left, right, text = _inputs(X, Y, metric, options)
    rows, stream = _internal.radius_neighbors(left, right, metric, radius, text)
    table = _table(stream)
    cuts = np.cumsum(np.bincount(_numpy(table, "query"), minlength=rows))[:-1]
    ind = _object_array(np.split(_numpy(table, "index"), cuts))
    if not return_distance:
        return ind
    return _object_array(np.split(_numpy(table, "distance"), cuts)), ind


def _join_inputs(left: Any, right: Any, metric: Any, options: dict[str, Any]):
    left_source, left_features = _source(left, "left")
    if right is left:
        right_source, right_features = None, left_features
    else:
        right_source, right_features = _source(right, "right")
    features = left_features if left_features is not None else right_features
    return left_source, right_source, _options(metric, options, features)


def knn_join(left: Any, right: Any, metric: str = "cosine", k: int = 10, **options: Any):
    """The SQL ``knn_join`` as a ``pyarrow.Table``: for each row of ``left`` its ``k`` nearest
    rows of ``right``.

    Inputs as in :func:`kneighbors`. Columns: every other column ``c`` of ``left`` as ``query_c``
    and of ``right`` as ``neighbor_c`` (a matrix has one, ``row``: its row position), then
    ``distance`` (float64) and ``rank`` (int32, 1 = nearest). Passing the same object twice is
    one input (what ``exclude_self=True`` needs).
    """
    k = _check_k(k)
    left_source, right_source, text = _join_inputs(left, right, metric, options)
    return _table(_internal.join_table(left_source, right_source, "knn", metric, float(k), text))


def radius_join(left: Any, right: Any, metric: str = "cosine", radius: float = 1.0, **options: Any):
    """The SQL ``radius_join`` as a ``pyarrow.Table``: every pair within ``radius`` (for ``dot``:
    at least ``radius``). Columns as in :func:`knn_join`, without ``rank``."""
    radius = _check_radius(radius)
    left_source, right_source, text = _join_inputs(left, right, metric, options)
    return _table(_internal.join_table(left_source, right_source, "radius", metric, radius, text))
