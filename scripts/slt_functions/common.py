import numpy as np
from scipy.spatial import distance as sd
from scipy.special import rel_entr

def fmt(v):
    """The runner's float rule: 6 significant digits, no exponent, tiny -> 0."""
    v = float(v)
    if np.isnan(v): return "NaN"
    if v == np.inf: return "Infinity"
    if v == -np.inf: return "-Infinity"
    if abs(v) < 1e-12: return "0"
    r = float(f"{v:.5e}")
    return np.format_float_positional(r, trim='-')

def dense(pairs, d):
    x = np.zeros(d, dtype=np.float64)
    for i, v in pairs:
        x[i] = float(np.float32(v))
    return x

def ref(metric, x, y, p=2.0):
    d = len(x)
    bx, by = x != 0, y != 0
    if metric == 'dot': return float(np.dot(x, y))
    if metric == 'cosine':
        nx, ny = np.linalg.norm(x), np.linalg.norm(y)
        if nx == 0 or ny == 0: return 1.0
        return float(sd.cosine(x, y))
    if metric == 'euclidean': return float(sd.euclidean(x, y))
    if metric == 'sqeuclidean': return float(sd.sqeuclidean(x, y))
    if metric == 'manhattan': return float(sd.cityblock(x, y))
    if metric == 'chebyshev': return float(sd.chebyshev(x, y)) if d else 0.0
    if metric == 'minkowski': return float(sd.minkowski(x, y, p))
    if metric == 'canberra': return float(sd.canberra(x, y))
    if metric == 'braycurtis':
        if not (bx | by).any(): return 0.0
        return float(sd.braycurtis(x, y))
    if metric == 'hamming': return float(sd.hamming(x, y))
    if metric == 'jaccard':
        if not (bx | by).any(): return 0.0
        return float(sd.jaccard(bx, by))
    if metric == 'dice':
        if not (bx | by).any(): return 0.0
        return float(sd.dice(bx, by))
    if metric == 'russellrao': return float(sd.russellrao(bx, by))
    if metric == 'correlation':
        if np.all(x == x[0]) or np.all(y == y[0]): return 1.0
        return float(sd.correlation(x, y))
    if metric == 'hellinger': return float(np.sqrt(np.sum((np.sqrt(x) - np.sqrt(y)) ** 2)) / np.sqrt(2))
    if metric == 'jensenshannon':
        m = (x + y) / 2
        return float(np.sqrt((rel_entr(x, m).sum() + rel_entr(y, m).sum()) / 2))
    if metric == 'kl_divergence': return float(rel_entr(x, y).sum())
    raise ValueError(metric)

def fnv1a(b):
    h = 0xcbf29ce484222325
    for c in b:
        h ^= c
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h

def char_ngrams(text, n, d=1 << 20):
    counts = {}
    chars = list(text)
    if len(chars) == 0:
        grams = []
    elif len(chars) < n:
        grams = [text]
    else:
        grams = ["".join(chars[s:s + n]) for s in range(len(chars) - n + 1)]
    for g in grams:
        k = fnv1a(g.encode('utf-8')) % d
        counts[k] = counts.get(k, 0) + 1
    return sorted(counts.items())
