"""Float64 oracles and input helpers shared by the tests of exercises 01-05.

Every oracle works from the definition, in float64, with no exercise's method in it: the
log-sum-exp by pairwise logaddexp (no max shift), attention from the dense matrix of scores with
the pairs that may not attend set to -inf (no tiles, no running max, no merge).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

DTYPES = pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
# float32 keeps about 7 digits; a few roundings per element cost a few units of 1e-7.
TOL = {np.float32: dict(rtol=5e-5, atol=2e-6), np.float64: dict(rtol=1e-10, atol=1e-12)}


# ---- oracles ------------------------------------------------------------------------------------

def logsumexp(x):
    """log(sum(exp(x))) over the last axis in float64 by pairwise logaddexp: no max shift anywhere."""
    return np.logaddexp.reduce(np.asarray(x, np.float64), axis=-1)


def softmax(x):
    """exp(x - lse) over the last axis in float64; a fully masked row (lse = -inf) weighs nothing."""
    x = np.asarray(x, np.float64)
    lse = np.asarray(logsumexp(x))[..., None]
    with np.errstate(invalid="ignore"):  # -inf - (-inf) on a fully masked row, replaced just below
        p = np.exp(x - lse)
    return np.where(np.isneginf(lse), 0.0, p)


def allowed_pairs(n_q, n_k, causal=False, mask=None):
    """True where query i may attend key j: the explicit mask AND (if causal) j <= i, top-left aligned."""
    allowed = np.ones((n_q, n_k), bool) if mask is None else np.array(mask, bool)
    if causal:
        allowed &= np.tri(n_q, n_k, dtype=bool)  # ones where j <= i
    return allowed


def oracle_schedule(n_q, n_k, block_q, block_k, causal=False, mask=None):
    """Every tile of the dense mask, kept iff some pair may attend, flagged iff some pair may not."""
    allowed = allowed_pairs(n_q, n_k, causal, mask)
    tiles = [(i, j, allowed[r:r + block_q, c:c + block_k])
             for i, r in enumerate(range(0, n_q, block_q)) for j, c in enumerate(range(0, n_k, block_k))]
    return [(i, j, not pairs.all()) for i, j, pairs in tiles if pairs.any()]


def tile_kinds(allowed, block_q, block_k):
    """(partial, full) bool (T_r, T_c) grids of a dense mask, from oracle_schedule: full when every
    pair of a tile may attend, partial when some but not all, neither (empty) when none."""
    t_r, t_c = -(-allowed.shape[0] // block_q), -(-allowed.shape[1] // block_k)
    partial, full = np.zeros((t_r, t_c), bool), np.zeros((t_r, t_c), bool)
    for i, j, flagged in oracle_schedule(*allowed.shape, block_q, block_k, mask=allowed):
        (partial if flagged else full)[i, j] = True
    return partial, full


def poison_unscheduled(k, v, schedule, block_k):
    """NaN in every key and value row that no scheduled tile covers; returns them and their indices."""
    covered = np.zeros(k.shape[0], bool)
    for _, j, _ in schedule:
        covered[j * block_k:(j + 1) * block_k] = True
    k, v = k.copy(), v.copy()
    k[~covered] = np.nan
    v[~covered] = np.nan
    return k, v, np.flatnonzero(~covered)


def documents_named_out_of_order(rng, runs):
    """Document ids from run numbers (0, 0, 1, 2, 2, ...: one run of positions per document), each
    document renamed so that the ids do not ascend: a mask that finds documents by searching a
    sorted array would pass ascending ids."""
    names = rng.permutation(int(runs.max()) + 1)
    if names.size > 1 and (np.diff(names) > 0).all():
        names = names[::-1]
    return names[runs]


def scores(q, k, scale=None):
    """S = scale · q kᵀ in float64; scale defaults to 1/sqrt(d) only when it is None."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    return (1 / math.sqrt(q.shape[-1]) if scale is None else scale) * (q @ k.T)


def weights(q, k, allowed=None, scale=None):
    """(P, lse): softmax of each row of scores over the allowed pairs, and its log-sum-exp."""
    s = scores(q, k, scale)
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    return softmax(s), logsumexp(s)  # lse = -inf where a row has no live key, also when n_k = 0


def attention(q, k, v, allowed=None, scale=None):
    """(o, lse) of dense attention in float64; a row with no live key gives (0, -inf)."""
    p, lse = weights(q, k, allowed, scale)
    return p @ np.asarray(v, np.float64), lse


# ---- inputs -------------------------------------------------------------------------------------

def random_qkv(rng, n_q, n_k, d, d_v, dtype=np.float64):
    """Standard normal q (n_q, d), k (n_k, d), v (n_k, d_v)."""
    return tuple(rng.standard_normal(shape).astype(dtype) for shape in [(n_q, d), (n_k, d), (n_k, d_v)])


def scores_with_masked_keys(rng, rows, cols, offset, live_col):
    """Scores near `offset`, about 40% of them -inf (masked keys); column `live_col` stays live."""
    x = offset + rng.standard_normal((rows, cols))
    x[rng.random((rows, cols)) < 0.4] = -np.inf
    x[:, live_col] = offset + rng.standard_normal(rows)  # every row keeps a live score
    return x


def with_offsets(q, k, row_offset, key_offset, scale):
    """Append two columns so that score s_ij gains row_offset_i + key_offset_j exactly (for this scale)."""
    n_q, n_k = len(q), len(k)
    q = np.hstack([q, np.asarray(row_offset, float)[:, None] / scale, np.ones((n_q, 1))])
    k = np.hstack([k, np.ones((n_k, 1)), np.asarray(key_offset, float)[:, None] / scale])
    return q, k


def case_id(causal=False, **sizes):
    """`nq5-nk7-bq2-bk3-causal`: a test case named by its sizes."""
    return "-".join(f"{name}{size}" for name, size in sizes.items()) + ("-causal" if causal else "")


def dims_id(shape):
    """`2x3x7`: an array's shape as a test id."""
    return "x".join(map(str, shape))
