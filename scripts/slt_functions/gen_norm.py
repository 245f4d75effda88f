import numpy as np
from common import *
f32 = lambda xs: np.array(xs, dtype=np.float32).astype(np.float64)
out=[]; w=out.append
def vec(idx, vals):
    return "{indices: [" + ", ".join(str(i) for i in idx) + "], values: [" + ", ".join(fmt(v) for v in vals) + "]}"
V = ([0, 3, 7], [3.0, -4.0, 0.3])
x = f32(V[1])
w("""# sparse_norm and sparse_normalize; expected figures computed with numpy by
# scripts/slt_functions/gen_norm.py.

# --- sparse_norm(v [, 'l1' | 'l2']) ---
""")
w("query RRRR")
w("SELECT sparse_norm(sparse_vector([0, 3, 7], [3.0, -4.0, 0.3]), 'l2'), sparse_norm(sparse_vector([0, 3, 7], [3.0, -4.0, 0.3]), 'L1'),")
w("       sparse_norm(sparse_vector([0, 3, 7], [3.0, -4.0, 0.3])), sparse_norm(sparse_vector([], []), 'l1')")
w("----")
w(f"{fmt(np.linalg.norm(x))} {fmt(np.abs(x).sum())} {fmt(np.linalg.norm(x))} 0")
w("")
w("""query RRR
SELECT sparse_norm(NULL, 'l2'), sparse_norm(sparse_vector([1], [2.0]), NULL), sparse_norm([3.0, 0, 4.0], 'l2')
----
NULL NULL 5

query T
SELECT arrow_typeof(sparse_norm(sparse_vector([1], [2.0]), 'l1'))
----
Float64
""")
rows = [(1, [0.5, 0, -1.5, 2]), (2, None), (3, [0.0]), (4, [1e-3, 2e-3])]
w("statement ok")
w("CREATE TABLE dv AS VALUES " + ", ".join(f"({i}, {('[' + ', '.join(repr(float(v)) for v in r) + ']') if r is not None else 'NULL'}, '{'l1' if i % 2 else 'l2'}')" for i, r in rows))
w("")
w("# the norm may differ by row")
w("query IRRR")
w("SELECT column1, sparse_norm(column2, 'l1'), sparse_norm(column2, 'l2'), sparse_norm(column2, column3) FROM dv ORDER BY column1")
w("----")
for i, r in rows:
    if r is None:
        w(f"{i} NULL NULL NULL"); continue
    v = f32(r)
    l1, l2 = np.abs(v).sum(), np.linalg.norm(v)
    w(f"{i} {fmt(l1)} {fmt(l2)} {fmt(l1 if i % 2 else l2)}")
w("")
w("""query error sparse_norm argument 2 \\(norm\\) must be 'l1' or 'l2', got 'l3'
SELECT sparse_norm(sparse_vector([1], [2.0]), 'l3')

query error sparse_norm argument 2 \\(norm\\) must be a string, got Int64
SELECT sparse_norm(sparse_vector([1], [2.0]), 2)

query error sparse_norm argument 1 has type Int64, which is not a sparse vector
SELECT sparse_norm(7, 'l2')

# --- sparse_normalize(v [, 'l1' | 'l2']) ---
""")
for kind in ['l2', 'l1']:
    n = np.linalg.norm(x) if kind == 'l2' else np.abs(x).sum()
    y = (x / n).astype(np.float32)
    w("query ?R")
    w(f"SELECT sparse_normalize(sparse_vector([0, 3, 7], [3.0, -4.0, 0.3]), '{kind}'), sparse_norm(sparse_normalize(sparse_vector([0, 3, 7], [3.0, -4.0, 0.3]), '{kind}'), '{kind}')")
    w("----")
    yy = y.astype(np.float64)
    w(f"{vec(V[0], yy)} {fmt(np.linalg.norm(yy) if kind == 'l2' else np.abs(yy).sum())}")
    w("")
w("""# The zero vector stays the zero vector (explicit zeros are kept as they are); NULL stays NULL.
query ???
SELECT sparse_normalize(sparse_vector([], []), 'l2'), sparse_normalize(sparse_vector([2], [0.0]), 'l1'), sparse_normalize(NULL, 'l1')
----
{indices: [], values: []} {indices: [2], values: [0]} NULL

# Any input type; the default norm is l2.
query ??
SELECT sparse_normalize(map([5, 1], [3.0, 4.0])), sparse_normalize([0, 2.0, 0, 2.0], 'l1')
----
{indices: [5, 1], values: [0.6, 0.8]} {indices: [1, 3], values: [0.5, 0.5]}
""")
w("query I?")
w("SELECT column1, sparse_normalize(column2, column3) FROM dv ORDER BY column1")
w("----")
for i, r in rows:
    if r is None:
        w(f"{i} NULL"); continue
    v = f32(r)
    idx = [k for k, t in enumerate(r) if t != 0]
    vals = v[idx]
    n = np.abs(vals).sum() if i % 2 else np.linalg.norm(vals)
    out_vals = (vals / n).astype(np.float32).astype(np.float64) if n > 0 else vals
    w(f"{i} {vec(idx, out_vals)}")
w("")
w("""query error sparse_normalize argument 2 \\(norm\\) must be 'l1' or 'l2', got 'max'
SELECT sparse_normalize(sparse_vector([1], [2.0]), 'max')

query error sparse vector column 'sparse_normalize argument 1', row 0: duplicate index 1
SELECT sparse_normalize(named_struct('indices', [1, 1], 'values', [1.0, 2.0]), 'l2')
""")
print("\n".join(out))
