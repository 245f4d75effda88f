"""Shared data for the tests: random sparse count matrices and a cut of a real data set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp

DATA = Path(__file__).parent / "data"
KOS = DATA / "kos_300.parquet"
KOS_DIM = 6906
# The repository's example data (data/README.md): 1,258 FACS-sorted PBMCs, UMI counts per gene.
PBMC = Path(__file__).parents[2] / "data" / "pbmc_facs_counts.parquet"


def csr_of(table, dim: int, column: str = "vec") -> sp.csr_matrix:
    """A table's sparse vector column as a float64 CSR matrix, built without Python loops."""
    vec = table.column(column).combine_chunks()
    indices = vec.field("indices")
    values = vec.field("values")
    indptr = indices.offsets.to_numpy().astype(np.int64)
    return sp.csr_matrix(
        (values.values.to_numpy().astype(np.float64), indices.values.to_numpy(), indptr),
        shape=(len(table), dim),
    )


def random_counts(rows: int, dim: int, density: float, seed: int) -> sp.csr_matrix:
    """Raw counts with a heavy tail (most in the tens to thousands), every row nonempty."""
    rng = np.random.default_rng(seed)
    m = sp.random(rows, dim, density=density, format="csr", random_state=rng,
                  data_rvs=lambda n: np.floor(rng.pareto(0.8, n) * 40 + 1).clip(1, 5000))
    # A row needs a nonzero (correlation of a constant row is undefined in scipy).
    lil = m.tolil()
    for i in np.flatnonzero(np.diff(m.indptr) == 0):
        lil[i, rng.integers(dim)] = float(rng.integers(1, 3000))
    return lil.tocsr().astype(np.float64)


@pytest.fixture(scope="session")
def counts():
    """(X, Y): 40 query rows and 160 rows searched, 500 columns, values up to 5000."""
    return random_counts(40, 500, 0.05, seed=1), random_counts(160, 500, 0.05, seed=2)


@pytest.fixture(scope="session")
def kos_table():
    return pq.read_table(KOS)


@pytest.fixture(scope="session")
def kos(kos_table):
    """The bundled KOS cut as a CSR matrix (word counts)."""
    return csr_of(kos_table, KOS_DIM)


@pytest.fixture(scope="session")
def pbmc():
    """The PBMC cut as a CSR matrix of raw UMI counts (cells x genes)."""
    table = pq.read_table(PBMC)
    return csr_of(table, int(table.schema.metadata[b"dim"]))


@pytest.fixture(scope="session")
def news20():
    """The 20 Newsgroups cut (data/news20_bow.parquet) as a CSR matrix of word counts."""
    table = pq.read_table(Path(__file__).parents[2] / "data" / "news20_bow.parquet")
    return csr_of(table, int(table.schema.metadata[b"dim"]))
