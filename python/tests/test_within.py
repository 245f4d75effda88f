"""``within=``: each query row's neighbours only among the searched rows of its own group, against
scipy's float64 distances over each group's rows alone."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import datafusion_sparse_knn as knn
from reference import close, reference_matrix, tolerance


def _labels(rows: int, groups: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(groups, size=rows)


@pytest.mark.parametrize("metric", ["cosine", "euclidean", "manhattan", "jaccard"])
def test_kneighbors_within_groups_against_scipy(counts, metric):
    X, Y = counts
    gx, gy = _labels(X.shape[0], 4, 3), _labels(Y.shape[0], 4, 4)
    k = 5
    d, i = knn.kneighbors(X, Y, k=k, metric=metric, within=(gx, gy))
    ref = reference_matrix(metric, X.toarray(), Y.toarray())
    tol = tolerance(metric, ref, X.toarray(), Y.toarray())
    for row in range(X.shape[0]):
        members = np.flatnonzero(gy == gx[row])
        assert members.size >= k, "every group has k rows searched"
        order = members[np.argsort(ref[row, members], kind="stable")[:k]]
        assert np.isin(i[row], members).all(), f"row {row}: a neighbour of another group"
        assert close(d[row], ref[row, order], tol[row, order]).all(), f"row {row}"
        assert close(d[row], ref[row, i[row]], tol[row, i[row]]).all(), f"row {row}"


def test_a_row_of_no_group_has_no_neighbours_and_searching_itself_takes_one_label_array(counts):
    X, _ = counts
    labels = np.array(["a", "b"] * (X.shape[0] // 2), dtype=object)
    labels[3] = None  # matches nothing
    d, i = knn.kneighbors(X, k=3, metric="cosine", within=labels, exclude_self=True)
    assert (i[3] == -1).all() and np.isnan(d[3]).all()
    for row in range(X.shape[0]):
        if row == 3:
            continue
        assert row not in i[row]
        assert all(labels[j] == labels[row] for j in i[row]), f"row {row}"

    # radius_neighbors: the pairs of the group within the radius, and no others.
    ref = reference_matrix("cosine", X.toarray(), X.toarray())
    dist, ind = knn.radius_neighbors(X, radius=0.9, metric="cosine", within=labels)
    for row in range(X.shape[0]):
        if labels[row] is None:
            assert ind[row].size == 0
            continue
        want = {j for j in range(X.shape[0]) if labels[j] == labels[row] and ref[row, j] <= 0.9}
        got = set(ind[row].tolist())
        # Pairs at the radius within rounding may go either way.
        edge = {j for j in want ^ got if abs(ref[row, j] - 0.9) < 1e-9}
        assert got ^ want <= edge, f"row {row}"


def test_arrow_inputs_name_a_column(counts):
    X, Y = counts
    gx, gy = _labels(X.shape[0], 3, 5), _labels(Y.shape[0], 3, 6)
    want_d, want_i = knn.kneighbors(X, Y, k=4, metric="euclidean", within=(gx, gy))

    def table(m, groups):
        vector = pa.StructArray.from_arrays(
            [
                pa.ListArray.from_arrays(pa.array(m.indptr.astype(np.int32)), pa.array(m.indices)),
                pa.ListArray.from_arrays(pa.array(m.indptr.astype(np.int32)), pa.array(m.data)),
            ],
            names=["indices", "values"],
        )
        return pa.table({"id": np.arange(m.shape[0]), "tenant": groups, "v": vector})

    out = knn.knn_join(table(X, gx), table(Y, gy), "euclidean", 4, within="tenant")
    got = out.sort_by([("query_id", "ascending"), ("rank", "ascending")])
    assert got.num_rows == X.shape[0] * 4
    np.testing.assert_array_equal(
        got.column("neighbor_id").to_numpy().reshape(-1, 4), want_i
    )
    np.testing.assert_array_equal(got.column("distance").to_numpy().reshape(-1, 4), want_d)
    assert (got.column("query_tenant").to_numpy() == got.column("neighbor_tenant").to_numpy()).all()


def test_bad_labels_say_what_is_wrong(counts):
    X, Y = counts
    with pytest.raises(ValueError, match="X has 40 rows but 3 labels"):
        knn.kneighbors(X, Y, k=2, within=([1, 2, 3], np.zeros(Y.shape[0])))
    with pytest.raises(ValueError, match="pass a pair"):
        knn.kneighbors(X, Y, k=2, within=np.zeros(X.shape[0]))
    with pytest.raises(ValueError, match="name its column"):
        knn.kneighbors(pa.table({"v": [1]}), Y, k=2, within=([1], np.zeros(Y.shape[0])))


@pytest.mark.parametrize("metric", ["cosine", "manhattan"])
def test_the_estimator_searches_within_the_groups_it_was_fitted_with(counts, metric):
    X, Y = counts
    gx, gy = _labels(X.shape[0], 3, 5), _labels(Y.shape[0], 3, 6)
    k = 4
    nn = knn.NearestNeighbors(n_neighbors=k, metric=metric).fit(Y, within=gy)
    d, i = nn.kneighbors(X, within=gx)
    ref = reference_matrix(metric, X.toarray(), Y.toarray())
    tol = tolerance(metric, ref, X.toarray(), Y.toarray())
    for row in range(X.shape[0]):
        members = np.flatnonzero(gy == gx[row])
        order = members[np.argsort(ref[row, members], kind="stable")[:k]]
        assert np.isin(i[row], members).all(), f"row {row}: a neighbour of another group"
        assert close(d[row], ref[row, order], tol[row, order]).all(), f"row {row}"
    # The same as the function's within=.
    fd, fi = knn.kneighbors(X, Y, k=k, metric=metric, within=(gx, gy))
    np.testing.assert_array_equal(i, fi)
    np.testing.assert_array_equal(d, fd)

    # X=None: the fitted rows against their own group, each row's own pair left out.
    d, i = nn.kneighbors()
    self_ref = reference_matrix(metric, Y.toarray(), Y.toarray())
    for row in range(Y.shape[0]):
        members = np.flatnonzero(gy == gy[row])
        members = members[members != row]
        assert np.isin(i[row], members).all() and row not in i[row], f"row {row}"
        best = np.sort(self_ref[row, members])[:k]
        assert close(np.sort(d[row]), best, 1e-9 * np.maximum(1, np.abs(best))).all(), f"row {row}"

    # radius_neighbors and the graphs take the groups too.
    r = float(np.median(ref))
    dist, ind = nn.radius_neighbors(X, radius=r, within=gx)
    for row in range(X.shape[0]):
        want = {j for j in np.flatnonzero(gy == gx[row]) if ref[row, j] <= r}
        got = set(ind[row].tolist())
        edge = {j for j in want ^ got if abs(ref[row, j] - r) < 1e-9}
        assert got ^ want <= edge, f"row {row}"
    graph = nn.kneighbors_graph(X, within=gx)
    assert graph.shape == (X.shape[0], Y.shape[0]) and graph.nnz == X.shape[0] * k
    rows, cols = graph.nonzero()
    assert (gy[cols] == gx[rows]).all()


def test_the_estimator_leaves_slots_empty_past_a_small_group_and_names_arrow_columns(counts):
    X, Y = counts
    gy = np.zeros(Y.shape[0], dtype=np.int64)
    gy[:2] = 7  # a group of two rows
    nn = knn.NearestNeighbors(n_neighbors=3, metric="cosine").fit(Y, within=gy)
    d, i = nn.kneighbors(X[:2], within=[7, 8])
    assert set(i[0][:2]) == {0, 1} and i[0][2] == -1 and np.isnan(d[0][2])
    assert (i[1] == -1).all(), "a label no fitted row has matches nothing"

    vectors = pa.StructArray.from_arrays(
        [
            pa.array([Y[r].indices.astype(np.int32) for r in range(Y.shape[0])]),
            pa.array([Y[r].data.astype(np.float32) for r in range(Y.shape[0])]),
        ],
        names=["indices", "values"],
    )
    table = pa.table({"vector": vectors, "tenant": pa.array(gy)})
    by_column = knn.NearestNeighbors(n_neighbors=2, metric="cosine").fit(table, within="tenant")
    by_labels = knn.NearestNeighbors(n_neighbors=2, metric="cosine").fit(Y, within=gy)
    np.testing.assert_array_equal(by_column.kneighbors()[1], by_labels.kneighbors()[1])


def test_the_estimator_says_when_within_is_missing_or_not_fitted(counts):
    X, Y = counts
    plain = knn.NearestNeighbors(n_neighbors=2).fit(Y)
    with pytest.raises(ValueError, match="fitted without within"):
        plain.kneighbors(X, within=np.zeros(X.shape[0]))
    grouped = knn.NearestNeighbors(n_neighbors=2).fit(Y, within=np.zeros(Y.shape[0]))
    with pytest.raises(ValueError, match="labels of X's rows too"):
        grouped.kneighbors(X)
    with pytest.raises(ValueError, match="rows but"):
        grouped.kneighbors(X, within=[1, 2])
    with pytest.raises(ValueError, match="no column"):
        knn.NearestNeighbors(n_neighbors=2).fit(pa.table({"v": [1]}), within="tenant")
