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
