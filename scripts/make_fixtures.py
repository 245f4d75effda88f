#!/usr/bin/env python3
"""Writes tests/fixtures/kos_scipy.txt: 40 rows of the UCI KOS bag of words and the distances
scipy.spatial.distance (and numpy / scipy.special for the metrics scipy lacks) gives between them.

Usage (from the repository root, needs numpy, scipy, pyarrow):
    python3 scripts/make_fixtures.py [data/kos_bow.parquet]

Format (one record a line, fields separated by single spaces, '#' starts a comment line):
    dim D                         dense dimension (the vocabulary size)
    L i idx:val idx:val ...       left row i (word counts; 0-based indices)
    R j idx:val ...               right row j
    KL_L i idx:val ...            left rows for the finite kl_divergence check (float32 values)
    KL_R j idx:val ...            right rows for the finite kl_divergence check (float32 values)
    D metric i v_0 ... v_{n-1}    distances from left row i to every right row
The metric names are the crate's (plus minkowski_p for a degree p). Values are printed with
repr() of float64, which round-trips exactly.
"""

import sys

import numpy as np
import pyarrow.parquet as pq
from scipy.spatial.distance import cdist
from scipy.special import rel_entr

SOURCE = sys.argv[1] if len(sys.argv) > 1 else "data/kos_bow.parquet"
OUT = "tests/fixtures/kos_scipy.txt"
N_LEFT = N_RIGHT = 20
KL_TOP = 48  # vocabulary of the finite kl check: the most frequent words of the 40 rows


def main():
    table = pq.read_table(SOURCE)
    dim = 6906  # UCI KOS vocabulary size (see data/README.md)
    rng = np.random.default_rng(20240611)
    picked = np.sort(rng.choice(table.num_rows, N_LEFT + N_RIGHT, replace=False))
    rows = table.take(picked).to_pylist()
    doc_ids = [r["doc_id"] for r in rows]
    dense = np.zeros((len(rows), dim), dtype=np.float64)
    for r, row in enumerate(rows):
        idx = np.asarray(row["vec"]["indices"], dtype=np.int64)
        val = np.asarray(row["vec"]["values"], dtype=np.float32)
        assert idx.max() < dim
        dense[r, idx] = val.astype(np.float64)
    left, right = dense[:N_LEFT], dense[N_LEFT:]

    def l1(m):
        # Normalised in float32 as the Rust test does: (v as f64 / sum) as f32.
        s = m.sum(axis=1, keepdims=True)
        s[s == 0] = 1
        return (m / s).astype(np.float32).astype(np.float64)

    pl, pr = l1(left), l1(right)
    bl, br = left != 0, right != 0

    def pairwise(f, a, b):
        return np.array([[f(x, y) for y in b] for x in a])

    with np.errstate(divide="ignore", invalid="ignore"):
        dists = {
            "cosine": cdist(left, right, "cosine"),
            "euclidean": cdist(left, right, "euclidean"),
            "sqeuclidean": cdist(left, right, "sqeuclidean"),
            "cityblock": cdist(left, right, "cityblock"),
            "chebyshev": cdist(left, right, "chebyshev"),
            "minkowski_1.5": cdist(left, right, "minkowski", p=1.5),
            "minkowski_3": cdist(left, right, "minkowski", p=3),
            "canberra": cdist(left, right, "canberra"),
            "braycurtis": cdist(left, right, "braycurtis"),
            # hamming on the raw values (x_i != y_i over all dim coordinates), as the SPEC defines it
            "hamming": cdist(left, right, "hamming"),
            # jaccard, dice, russellrao on the boolean "nonzero" view
            "jaccard": cdist(bl, br, "jaccard"),
            "dice": cdist(bl, br, "dice"),
            "russellrao": cdist(bl, br, "russellrao"),
            "correlation": cdist(left, right, "correlation"),
            # scipy renormalises its inputs; these are already l1-normalised (in float32)
            "jensenshannon": cdist(pl, pr, "jensenshannon"),
            # scipy has no dot, hellinger or kl: numpy / scipy.special on the same arrays
            "dot": left @ right.T,
            "hellinger": pairwise(
                lambda x, y: np.sqrt(np.sum((np.sqrt(x) - np.sqrt(y)) ** 2)) / np.sqrt(2), pl, pr
            ),
            "kl_divergence": pairwise(lambda x, y: rel_entr(x, y).sum(), pl, pr),
        }

    # Finite kl: left rows cut to the most frequent words, right rows smoothed over those words.
    top = np.argsort(-(dense != 0).sum(axis=0), kind="stable")[:KL_TOP]
    kl_left = np.zeros_like(left)
    kl_left[:, top] = left[:, top]
    kl_left = l1(kl_left)
    kl_right = right.copy()
    kl_right[:, top] += 0.25
    kl_right = l1(kl_right)
    dists["kl_smoothed"] = pairwise(lambda x, y: rel_entr(x, y).sum(), kl_left, kl_right)
    assert np.isfinite(dists["kl_smoothed"]).all()

    def fmt_row(tag, i, v):
        nz = np.nonzero(v)[0]
        body = " ".join(f"{j}:{str(np.float32(v[j]))}" for j in nz)
        return f"{tag} {i} {body}".rstrip()

    with open(OUT, "w") as f:
        f.write("# 40 rows of the UCI KOS bag of words (kos_bow.parquet, CC BY 4.0, UCI Machine Learning\n")
        f.write(f"# Repository, Bag of Words data set), doc_ids {doc_ids}.\n")
        f.write(f"# Written by scripts/make_fixtures.py with scipy, numpy {np.__version__}.\n")
        f.write(f"dim {dim}\n")
        for i, v in enumerate(left):
            f.write(fmt_row("L", i, v) + "\n")
        for j, v in enumerate(right):
            f.write(fmt_row("R", j, v) + "\n")
        for i, v in enumerate(kl_left):
            f.write(fmt_row("KL_L", i, v) + "\n")
        for j, v in enumerate(kl_right):
            f.write(fmt_row("KL_R", j, v) + "\n")
        for name, m in dists.items():
            assert m.shape == (N_LEFT, N_RIGHT)
            assert not np.isnan(m).any(), name
            for i in range(N_LEFT):
                f.write(f"D {name} {i} " + " ".join(repr(float(x)) for x in m[i]) + "\n")


if __name__ == "__main__":
    main()
