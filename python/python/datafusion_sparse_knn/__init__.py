"""Exact nearest neighbours over sparse vectors, from Python.

Two ways in:

* ``register(ctx)`` adds every function of the Rust crate ``datafusion-sparse-knn`` to a
  ``datafusion.SessionContext`` (datafusion-python 55), so SQL such as
  ``SELECT * FROM knn_join('docs', 'docs', 'cosine', 10)`` runs in that session.
* ``kneighbors``, ``radius_neighbors``, ``knn_join`` and ``radius_join`` need no DataFusion in
  Python: they take ``scipy.sparse`` matrices, dense 2-D numpy arrays, Arrow data (a pyarrow
  Table or RecordBatch, or any object with ``__arrow_c_stream__``) or Parquet paths.
* ``NearestNeighbors`` (scikit-learn's estimator over an index that stays built: ``fit`` once,
  then ``kneighbors``, ``radius_neighbors`` and the graphs), ``KNeighborsTransformer`` (for
  ``scanpy.pp.neighbors(adata, transformer=...)``), ``precomputed_knn`` (UMAP's) and
  ``pairwise_distances`` (a dense distance matrix, like scikit-learn's).

Every SQL option (``p``, ``dim``, ``device``, ``exclude_self``, ``within``, ``left_column``,
``right_column``, ``gpu_memory_limit``) is a keyword argument; ``device`` is ``'auto'`` (a CUDA GPU when there is
one), ``'cpu'`` or ``'gpu'``. Bad input raises ``ValueError`` with the Rust error's message.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from . import _internal
from ._estimator import KNeighborsTransformer, NearestNeighbors, precomputed_knn
from ._inputs import (
    _check_k,
    _check_radius,
    _distance_dtype,
    _float_kind,
    _inputs,
    _object_array,
    _options,
    _source,
)
from ._internal import Source, __version__
from ._pairwise import pairwise_distances

__all__ = [
    "__version__",
    "KNeighborsTransformer",
    "NearestNeighbors",
    "Source",
    "kneighbors",
    "knn_join",
    "pairwise_distances",
    "precomputed_knn",
    "radius_join",
    "radius_neighbors",
    "register",
    "scalar_functions",
    "table_functions",
]



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
            ``exclude_self``, ``left_column``, ``right_column``, ``gpu_memory_limit``, and
            ``within``: each row's neighbours only among the rows of ``Y`` of its own group
            (its tenant, category, cell type): for matrices the labels of X's rows (``Y`` None)
            or a pair ``(labels of X, labels of Y)``; for Arrow data or Parquet a column name.
            A row whose label is None, or that no row of ``Y`` shares, has no neighbours (its
            slots NaN / -1).

    Returns:
        ``(distances, indices)``: float and int64 arrays of shape (rows of X, k), nearest first
        (for ``dot``, a similarity, largest first); ties go to the earlier row of ``Y``. A slot
        left empty (a NULL vector has no neighbours) has distance NaN and index -1. The
        distances are in scikit-learn's dtype, as :class:`NearestNeighbors` gives them
        (float32 for float32 sparse matrices under ``cosine`` or ``euclidean``, else float64);
        computed and ordered in float64 either way.
    """
    k = _check_k(k)
    left, right, text = _inputs(X, Y, metric, options)
    rows, stream = _internal.kneighbors(left, right, metric, k, text)
    table = _table(stream)
    indices = _numpy(table, "index").reshape(rows, k)
    if not return_distance:
        return indices
    distances = _numpy(table, "distance").reshape(rows, k)
    return distances.astype(_result_dtype(X, Y, metric, options), copy=False), indices


def _result_dtype(X: Any, Y: Any, metric: Any, options: dict[str, Any]) -> np.dtype:
    """scikit-learn's distance dtype for ``X`` against ``Y`` (None: ``X`` itself)."""
    kinds = [_float_kind(X)] + ([] if Y is None else [_float_kind(Y)])
    return _distance_dtype(metric, options.get("p"), kinds)


def _table(stream: Any) -> pa.Table:
    return pa.RecordBatchReader.from_stream(stream).read_all()


def _numpy(table: pa.Table, column: str) -> np.ndarray:
    # Writable, like scikit-learn's results (a zero-copy view of Arrow memory is read-only).
    return table.column(column).combine_chunks().to_numpy(zero_copy_only=False, writable=True)


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
    with one float (as in :func:`kneighbors`) / int64 array per row of ``X``, nearest first (the
    radius applies to the float64 distances).
    """
    radius = _check_radius(radius)
    left, right, text = _inputs(X, Y, metric, options)
    rows, stream = _internal.radius_neighbors(left, right, metric, radius, text)
    table = _table(stream)
    cuts = np.cumsum(np.bincount(_numpy(table, "query"), minlength=rows))[:-1]
    ind = _object_array(np.split(_numpy(table, "index"), cuts))
    if not return_distance:
        return ind
    distances = _numpy(table, "distance").astype(_result_dtype(X, Y, metric, options), copy=False)
    return _object_array(np.split(distances, cuts)), ind


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
