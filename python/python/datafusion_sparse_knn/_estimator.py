"""scikit-learn's ``NearestNeighbors`` and ``KNeighborsTransformer`` over an index that stays
built: ``fit`` builds the right side once (on the CPU or, with ``device='gpu'``, on the GPU,
where it stays), and every later call probes it directly, without a DataFusion plan.

scikit-learn is not needed: when it is importable the estimators subclass its ``BaseEstimator``
(and ``TransformerMixin``), so ``clone``, pipelines and its HTML repr work; otherwise they bring
their own ``get_params`` / ``set_params`` with the same behaviour.
"""

from __future__ import annotations

import inspect
import numbers
import os
from typing import Any

import numpy as np

from ._inputs import (
    _NEEDS_DIM,
    _check_radius,
    _distance_dtype,
    _float_kind,
    _labels,
    _object_array,
    _option_text,
    _rows,
)
from ._internal import FittedIndex, Source

try:  # scikit-learn is optional
    from sklearn.base import BaseEstimator as _Base
    from sklearn.base import TransformerMixin as _TransformerBase
    from sklearn.exceptions import NotFittedError
except ImportError:  # pragma: no cover - depends on the environment

    class NotFittedError(ValueError, AttributeError):
        """Raised when an estimator is used before ``fit`` (scikit-learn's, when it is there)."""

    class _Base:
        """``get_params`` / ``set_params`` as scikit-learn's ``BaseEstimator`` has them: the
        parameters are the ``__init__`` arguments, stored under their own names."""

        @classmethod
        def _get_param_names(cls) -> list[str]:
            signature = inspect.signature(cls.__init__)
            return sorted(
                p.name
                for p in signature.parameters.values()
                if p.name != "self" and p.kind != p.VAR_KEYWORD
            )

        def get_params(self, deep: bool = True) -> dict[str, Any]:
            return {name: getattr(self, name) for name in self._get_param_names()}

        def set_params(self, **params: Any):
            valid = self._get_param_names()
            for key, value in params.items():
                if key not in valid:
                    msg = (
                        f"Invalid parameter {key!r} for estimator {type(self).__name__}. "
                        f"Valid parameters are: {valid!r}."
                    )
                    raise ValueError(msg)
                setattr(self, key, value)
            return self

        def __repr__(self) -> str:
            params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
            return f"{type(self).__name__}({params})"

    class _TransformerBase:
        def fit_transform(self, X, y=None, **fit_params):
            return self.fit(X, y, **fit_params).transform(X)


__all__ = ["KNeighborsTransformer", "NearestNeighbors", "NotFittedError", "precomputed_knn"]

# The SQL options an estimator takes as parameters (exclude_self is its own business: X=None).
_OPTION_PARAMS = (
    "p",
    "dim",
    "device",
    "gpu_memory_limit",
    "gpus",
    "dense_columns",
    "left_column",
    "right_column",
)


def _check_n_neighbors(n: Any, what: str = "n_neighbors") -> int:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        msg = f"{what} must be an integer >= 1, got {n!r}"
        raise ValueError(msg)
    return int(n)


def _frombuffer(buffer: bytearray, dtype, shape=None) -> np.ndarray:
    """A writable numpy view of a bytearray the Rust side filled (no copy)."""
    out = np.frombuffer(buffer, dtype=dtype)
    return out if shape is None else out.reshape(shape)


class NearestNeighbors(_Base):
    """Exact nearest neighbours over sparse vectors, shaped like scikit-learn's
    ``NearestNeighbors(algorithm='brute')``, over an index that stays built.

    Args:
        n_neighbors: neighbours ``kneighbors`` returns by default.
        radius: the default radius of ``radius_neighbors``.
        metric: any metric of the SQL functions (``cosine``, ``euclidean``, ``manhattan``,
            ``minkowski`` with ``p=``, ``jaccard``, ``jensenshannon``, ``dot``, ...).
        p, dim, device, gpu_memory_limit, gpus, dense_columns, left_column, right_column: the
            SQL options (``device='auto'|'cpu'|'gpu'``; ``'gpu'`` keeps the index on the GPU).
            For a matrix, ``dim`` defaults to its number of columns where the metric needs it.

    ``fit(Y)`` takes a ``scipy.sparse`` matrix, a dense 2-D array, Arrow data or a Parquet path;
    queries the same kinds. Ties go to the earlier fitted row. For ``dot`` (a similarity),
    "nearest" is largest first.

    ``within=``: ``fit(Y, within=labels)`` gives each fitted row a group (a value a row: numbers
    or strings; None matches nothing), and every query then passes its rows' labels
    (``kneighbors(X, within=labels)``; for ``X=None`` the fitted rows' own): each row's
    neighbours come from its own group only, and a row whose group has fewer than
    ``n_neighbors`` other rows has empty slots (distance NaN, index -1). With Arrow data or a
    Parquet path, ``within`` may name a column of it instead. The labels are not saved in an
    index file.

    Distances come in the dtype scikit-learn (1.9) gives them in: float32 where the fitted rows
    and the query rows are float32 matrices and the metric is ``cosine``, or ``euclidean``
    (``minkowski`` with ``p=2``) and both are sparse; else float64 (scikit-learn's ArgKmin and
    scipy paths). They are computed in float64 and ordered by that (ties by fitted row), then
    rounded, so a float32 row stays in ascending order.
    """

    def __init__(
        self,
        n_neighbors: int = 5,
        radius: float = 1.0,
        metric: str = "cosine",
        *,
        p: float | None = None,
        dim: int | None = None,
        device: str | None = None,
        gpu_memory_limit: str | int | None = None,
        gpus: Any = None,
        dense_columns: Any = None,
        left_column: str | None = None,
        right_column: str | None = None,
    ) -> None:
        self.n_neighbors = n_neighbors
        self.radius = radius
        self.metric = metric
        self.p = p
        self.dim = dim
        self.device = device
        self.gpu_memory_limit = gpu_memory_limit
        self.gpus = gpus
        self.dense_columns = dense_columns
        self.left_column = left_column
        self.right_column = right_column

    # -- fitting ---------------------------------------------------------------------------

    def _options_text(self, columns: int | None) -> str:
        if not isinstance(self.metric, str):
            msg = f"metric must be a string, got {type(self.metric).__name__}"
            raise ValueError(msg)
        options = {k: getattr(self, k) for k in _OPTION_PARAMS if getattr(self, k) is not None}
        if columns is not None and "dim" not in options and self.metric.lower() in _NEEDS_DIM:
            options["dim"] = columns
        return ", ".join(f"{k}={_option_text(k, v)}" for k, v in options.items())

    def fit(self, X: Any, y: Any = None, within: Any = None) -> NearestNeighbors:
        """Builds the index of the rows of ``X`` (``y`` is ignored); ``within``: the rows'
        groups (see the class)."""
        rows, n, columns = _rows(X, "X")
        groups = _within_source(within, X, n, "X")
        self._index = FittedIndex.fit(rows, self.metric, self._options_text(columns), groups)
        self._fit_X = X
        self._fit_kind = _float_kind(X)
        self.n_samples_fit_ = self._index.n_rows
        self.effective_metric_ = self._index.metric
        self.device_ = self._index.device
        if columns is not None:
            self.n_features_in_ = columns
        elif self.dim is not None:
            self.n_features_in_ = int(self.dim)
        elif hasattr(self, "n_features_in_"):
            del self.n_features_in_
        return self

    def _fitted(self) -> FittedIndex:
        index = getattr(self, "_index", None)
        if index is None:
            msg = (
                f"This {type(self).__name__} instance is not fitted yet. Call 'fit' with "
                "appropriate arguments before using this estimator."
            )
            raise NotFittedError(msg)
        return index

    def _distance_dtype(self, X: Any) -> np.dtype:
        """scikit-learn's dtype for the distances of the rows ``X`` (None: the fitted rows)."""
        index = self._fitted()
        fitted = getattr(self, "_fit_kind", (False, False))
        kinds = [fitted] if X is None else [fitted, _float_kind(X)]
        # The metric as named (scikit-learn tells "l2" from "euclidean"), the index's p.
        return _distance_dtype(self.metric, index.params[0], kinds)

    def _query(self, X: Any):
        """Query rows (None: the fitted rows) and their count."""
        index = self._fitted()
        if X is None:
            return None, index.n_rows
        rows, n, columns = _rows(X, "X")
        expected = getattr(self, "n_features_in_", None)
        if columns is not None and expected is not None and columns != expected:
            msg = (
                f"X has {columns} features, but {type(self).__name__} is expecting "
                f"{expected} features as input."
            )
            raise ValueError(msg)
        return rows, n

    # -- queries ---------------------------------------------------------------------------

    def kneighbors(
        self,
        X: Any = None,
        n_neighbors: int | None = None,
        return_distance: bool = True,
        within: Any = None,
    ):
        """The ``n_neighbors`` nearest fitted rows of each row of ``X``: ``(distances,
        indices)``, float (see the class) and int64 arrays of shape (rows of X, n_neighbors),
        nearest first. ``X=None``: the fitted rows, each row's own pair left out (as
        scikit-learn does). ``within``: the rows' groups (see the class)."""
        index = self._fitted()
        k = _check_n_neighbors(self.n_neighbors if n_neighbors is None else n_neighbors)
        rows, n = self._query(X)
        n, distances, indices = index.kneighbors(rows, k, _within_source(within, X, n, "X"))
        ind = _frombuffer(indices, np.int64, (n, k))
        if not return_distance:
            return ind
        dist = _frombuffer(distances, np.float64, (n, k))
        return dist.astype(self._distance_dtype(X), copy=False), ind

    def radius_neighbors(
        self,
        X: Any = None,
        radius: float | None = None,
        return_distance: bool = True,
        sort_results: bool = False,
        within: Any = None,
    ):
        """Every fitted row within ``radius`` of each row of ``X`` (for ``dot``: at least
        ``radius``): object arrays of one float (see the class) / int64 array per row. The radius
        is applied to the float64 distances. Always nearest first,
        ties by row (``sort_results`` is accepted for scikit-learn's signature). ``X=None``:
        the fitted rows, own pair left out. ``within``: the rows' groups (see the class)."""
        distances, indices, counts = self._radius(X, radius, within)
        cuts = np.cumsum(counts)[:-1]
        ind = _object_array(np.split(indices, cuts))
        if not return_distance:
            return ind
        return _object_array(np.split(distances, cuts)), ind

    def _radius(self, X: Any, radius: float | None, within: Any = None):
        index = self._fitted()
        radius = _check_radius(self.radius if radius is None else radius)
        rows, n = self._query(X)
        groups = _within_source(within, X, n, "X")
        counts, distances, indices = index.radius_neighbors(rows, radius, groups)
        return (
            _frombuffer(distances, np.float64).astype(self._distance_dtype(X), copy=False),
            _frombuffer(indices, np.int64),
            _frombuffer(counts, np.int64),
        )

    # -- graphs ----------------------------------------------------------------------------

    def kneighbors_graph(
        self,
        X: Any = None,
        n_neighbors: int | None = None,
        mode: str = "connectivity",
        within: Any = None,
    ):
        """The kNN graph as a ``scipy.sparse.csr_matrix`` of shape (rows of X, fitted rows):
        ``mode='connectivity'`` stores float64 ones, ``'distance'`` the distances (in the
        kneighbors dtype); each row holds its ``n_neighbors`` neighbours in ascending distance,
        as scikit-learn's (see :func:`_neighbors_graph` on keeping that order)."""
        _check_mode(mode)
        k = _check_n_neighbors(self.n_neighbors if n_neighbors is None else n_neighbors)
        distances, indices = self.kneighbors(X, k, return_distance=True, within=within)
        counts = np.full(indices.shape[0], k, dtype=np.int64)
        kept = indices >= 0
        if not kept.all():
            # An empty slot (a NULL query vector has no neighbours) is no entry of the graph.
            counts = kept.sum(axis=1)
            distances, indices = distances[kept], indices[kept]
        columns = self.n_samples_fit_
        return _neighbors_graph(distances.ravel(), indices.ravel(), counts, mode, columns)

    def radius_neighbors_graph(
        self,
        X: Any = None,
        radius: float | None = None,
        mode: str = "connectivity",
        sort_results: bool = False,
        within: Any = None,
    ):
        """Every pair within ``radius`` as a ``scipy.sparse.csr_matrix`` of shape (rows of X,
        fitted rows), each row in ascending distance (``mode`` and dtypes as in
        ``kneighbors_graph``)."""
        _check_mode(mode)
        distances, indices, counts = self._radius(X, radius, within)
        return _neighbors_graph(distances, indices, counts, mode, self.n_samples_fit_)

    # -- index files -----------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> int:
        """Writes the fitted index to an index file (``.skidx``): the fitted rows and their
        index, versioned and checksummed. Returns the bytes written. ``NearestNeighbors.load``
        (or a ``knn_join`` whose right input is the path) opens it without a rebuild."""
        return self._fitted().save(os.fspath(path))

    @classmethod
    def load(cls, path: str | os.PathLike, **params: Any) -> NearestNeighbors:
        """A fitted estimator over an index file (from ``save`` or ``sparse-knn index``),
        nothing rebuilt. ``params`` are the estimator's (``n_neighbors``, ``radius``,
        ``device``, ``left_column``, ...); the metric and its ``p`` / ``dim`` are the file's
        (its first metric). ``device`` defaults to the CPU here."""
        nn = cls(**params)
        options = {k: getattr(nn, k) for k in ("device", "gpu_memory_limit", "gpus", "dense_columns", "left_column")}
        text = ", ".join(f"{k}={_option_text(k, v)}" for k, v in options.items() if v is not None)
        nn._index = FittedIndex.load(os.fspath(path), text)
        nn._fit_X = None
        # An index file keeps its rows as the crate stores them, not the matrix they came from.
        nn._fit_kind = (False, False)
        nn.metric = nn._index.metric
        p, dim = nn._index.params
        if nn.metric == "minkowski":
            nn.p = p
        if dim is not None:
            nn.dim = dim
            nn.n_features_in_ = int(dim)
        nn.n_samples_fit_ = nn._index.n_rows
        nn.effective_metric_ = nn._index.metric
        nn.device_ = nn._index.device
        return nn


def _within_source(within: Any, X: Any, rows: int | None, what: str) -> Source | None:
    """``within=`` of an estimator call as a one-column ``Source``: labels, a value a row, or
    the name of a column of ``X``'s Arrow data or Parquet file."""
    if within is None:
        return None
    if isinstance(within, str):
        if X is None:
            msg = "within: X=None takes the fitted rows' own labels; leave within out"
            raise ValueError(msg)
        labels = _column_of(X, within, what)
    else:
        if rows is None:
            msg = f"within: the number of rows of {what} is not known; name a column instead"
            raise ValueError(msg)
        labels = _labels(within, rows, what)
    import pyarrow as pa

    return Source.from_arrow(pa.table({"group": labels}))


def _column_of(X: Any, name: str, what: str):
    import pyarrow as pa

    if isinstance(X, (str, os.PathLike)):
        import pyarrow.parquet as pq

        try:
            X = pq.read_table(os.fspath(X), columns=[name])
        except (pa.ArrowInvalid, KeyError) as e:
            msg = f"within={name}: {what} has no such column ({e})"
            raise ValueError(msg) from None
    if isinstance(X, pa.RecordBatch):
        X = pa.Table.from_batches([X])
    if not isinstance(X, pa.Table):
        msg = (
            f"within={name}: a column name goes with Arrow data or a Parquet path; {what} is "
            f"{type(X).__name__}: pass labels, a value a row"
        )
        raise ValueError(msg)
    if name not in X.column_names:
        msg = f"within={name}: {what} has no column '{name}' (it has {X.column_names})"
        raise ValueError(msg)
    return X.column(name).combine_chunks()


def _neighbors_graph(
    distances: np.ndarray, indices: np.ndarray, counts: np.ndarray, mode: str, columns: int
):
    """A neighbour graph as scikit-learn builds one (a ``csr_matrix`` by default, int64 indices):
    ``counts[i]`` entries for row ``i``, stored nearest first, not by column (scanpy and UMAP read
    each row's data in storage order as its neighbours by rank). Data: the distances in their
    dtype, or float64 ones for ``'connectivity'`` (scikit-learn's ``np.ones``).

    scipy works out ``has_sorted_indices`` / ``has_canonical_format`` from the arrays (False
    where a row is not in column order) and nothing here sets them. ``copy()``, ``tocsr()`` and
    ``astype`` to the same dtype keep the order; ``astype`` to another dtype, like any operation
    that sums duplicates, sorts each non-canonical row by column, in scipy (1.17) as for
    scikit-learn's graphs. That is why the distances come in scikit-learn's dtype: a consumer
    that expects it has nothing to convert.
    """
    import scipy.sparse as sp

    indptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    data = np.ones(len(indices)) if mode == "connectivity" else distances
    # As scikit-learn builds it: a csr_array keeps the int64 indices (a csr_matrix made from the
    # arrays would narrow them to int32), handed out in the container its config asks for.
    graph = sp.csr_array((data, indices, indptr), shape=(len(counts), columns))
    return graph if _sparse_interface() == "sparray" else sp.csr_matrix(graph)


def _sparse_interface() -> str:
    """scikit-learn's ``sparse_interface`` setting (1.9: ``'spmatrix'`` unless set to
    ``'sparray'``); scipy's matrices without scikit-learn."""
    try:
        from sklearn import get_config
    except ImportError:  # pragma: no cover - depends on the environment
        return "spmatrix"
    return get_config().get("sparse_interface", "spmatrix")


def _check_mode(mode: str) -> None:
    if mode not in ("connectivity", "distance"):
        msg = f'Unsupported mode, must be one of "connectivity", or "distance" but got "{mode}" instead'
        raise ValueError(msg)


class KNeighborsTransformer(_TransformerBase, _Base):
    """scikit-learn's ``KNeighborsTransformer`` over the fitted index: ``transform(X)`` is the
    kNN graph of ``X`` against the fitted rows as a CSR matrix, ``n_neighbors + 1`` entries a row
    for ``mode='distance'`` (``n_neighbors`` for ``'connectivity'``) in ascending distance.
    ``fit_transform(X)`` (and ``transform`` of the fitted object itself) puts each sample's own
    pair first, at an explicitly stored distance 0, as ``scanpy.pp.neighbors(adata,
    transformer=...)`` and UMAP's ``precomputed_knn`` expect.

    The graph's dtype is scikit-learn's: the distances as :class:`NearestNeighbors` gives them
    (float32 for float32 sparse rows under ``cosine`` or ``euclidean``), ones float64. scanpy
    reads each row's entries in storage order as its neighbours by rank, so they must reach it
    unconverted: a change of dtype sorts each row by column in scipy.

    Parameters and options as in :class:`NearestNeighbors`.
    """

    def __init__(
        self,
        *,
        mode: str = "distance",
        n_neighbors: int = 5,
        metric: str = "cosine",
        p: float | None = None,
        dim: int | None = None,
        device: str | None = None,
        gpu_memory_limit: str | int | None = None,
        gpus: Any = None,
        dense_columns: Any = None,
        left_column: str | None = None,
        right_column: str | None = None,
    ) -> None:
        self.mode = mode
        self.n_neighbors = n_neighbors
        self.metric = metric
        self.p = p
        self.dim = dim
        self.device = device
        self.gpu_memory_limit = gpu_memory_limit
        self.gpus = gpus
        self.dense_columns = dense_columns
        self.left_column = left_column
        self.right_column = right_column

    def fit(self, X: Any, y: Any = None) -> KNeighborsTransformer:
        _check_mode(self.mode)
        params = {k: getattr(self, k) for k in ("n_neighbors", "metric", *_OPTION_PARAMS)}
        self._nn = NearestNeighbors(**params).fit(X)
        self.n_samples_fit_ = self._nn.n_samples_fit_
        self.effective_metric_ = self._nn.effective_metric_
        if hasattr(self._nn, "n_features_in_"):
            self.n_features_in_ = self._nn.n_features_in_
        return self

    def transform(self, X: Any):
        nn = getattr(self, "_nn", None)
        if nn is None:
            msg = (
                "This KNeighborsTransformer instance is not fitted yet. Call 'fit' with "
                "appropriate arguments before using this estimator."
            )
            raise NotFittedError(msg)
        add_one = self.mode == "distance"
        if X is nn._fit_X:
            return self._self_first_graph()
        return nn.kneighbors_graph(X, mode=self.mode, n_neighbors=self.n_neighbors + add_one)

    def fit_transform(self, X: Any, y: Any = None):
        return self.fit(X).transform(X)

    def _self_first_graph(self):
        """The fitted rows' graph with each sample itself first at distance 0 (stored), in
        the distances' dtype."""
        nn = self._nn
        others = self.n_neighbors if self.mode == "distance" else self.n_neighbors - 1
        n = nn.n_samples_fit_
        k = others + 1
        indices = np.empty((n, k), dtype=np.int64)
        distances = np.zeros((n, k), dtype=nn._distance_dtype(None))
        indices[:, 0] = np.arange(n)
        if others > 0:
            distances[:, 1:], indices[:, 1:] = nn.kneighbors(None, others)
        counts = np.full(n, k, dtype=np.int64)
        return _neighbors_graph(distances.ravel(), indices.ravel(), counts, self.mode, n)


def precomputed_knn(X: Any, n_neighbors: int = 15, metric: str = "euclidean", **options: Any):
    """UMAP's ``precomputed_knn``: ``(knn_indices, knn_dists)`` of shape (rows of X,
    n_neighbors), each row's own pair first at distance 0 (UMAP's ``n_neighbors`` counts it),
    then its ``n_neighbors - 1`` nearest other rows (distances in the dtype of
    :class:`NearestNeighbors`)::

        knn = datafusion_sparse_knn.precomputed_knn(X, 15, "cosine")
        umap.UMAP(n_neighbors=15, metric="cosine", precomputed_knn=knn).fit(X)

    Options as in :class:`NearestNeighbors`.
    """
    k = _check_n_neighbors(n_neighbors)
    transformer = KNeighborsTransformer(n_neighbors=k - 1, metric=metric, mode="distance", **options)
    graph = transformer.fit_transform(X)
    n = graph.shape[0]
    return graph.indices.reshape(n, k).astype(np.int64), graph.data.reshape(n, k)
