"""Exercise 04 — attention one tile at a time.

The idea
    Exercise 02 walked one row of scores in chunks with a running max m and a running sum l.
    Attention does it for a block of queries at once: cut Q into blocks of block_q rows and K, V
    into blocks of block_k rows, and for each query block walk its key blocks one tile
    S = scale · Q_i K_jᵀ (block_q, block_k) at a time. Per query row keep m, l and an
    unnormalised accumulator acc = sum_j exp(s_j - m) v_j. When a tile raises m, all that was
    summed so far was measured against the old max: scale l and acc by alpha = exp(m_old - m_new).
    Divide acc by l once, after the last tile.

The formula (one query block, one of its tiles)
    m_new = max(m, rowmax(S))        alpha = exp(m - m_new)      P = exp(S - m_new)
    l     = alpha·l + rowsum(P)      acc   = alpha·acc + P V_j    m = m_new
    after the last tile:  o = acc / l,  lse = m + log(l)

In the paper
    FlashAttention (Dao et al., 2022), Algorithm 1: line 2 starts m = -inf, l = 0; lines 9-11
    compute S_ij, the tile's rowmax and rowsum, then m_new and l_new; line 12 rescales O_i and
    multiplies by diag(l_new)^-1 after every tile. FlashAttention-2: Faster Attention with Better
    Parallelism and Work Partitioning (Dao, 2023, arXiv 2307.08691), Algorithm 1,
    keeps O_i unnormalised (lines 8-10), divides once (line 12) and sets L_i = m_i + log(l_i)
    (line 13). Here: the order of FlashAttention-2, the names of both. Beware its line 10: it prints
    the rescale as diag(e^(m_old - m_new))^-1, an inverse too many (a known typo, also in its
    online-softmax derivation): multiply acc by alpha, as here; taken as printed, the first tile
    divides by e^(-inf) = 0 and gives NaN.
    Theorem 1: Algorithm 1 needs O(n) memory beyond its inputs and output (m and l; acc is the
    output), never an n x n array: S, P and the allowed pairs (tile_schedule's too) exist one
    tile at a time. The tests measure it.

Which tiles are worth computing
    A tile where no (query, key) pair may attend adds exp(-inf) = 0 to l and acc: skip it, and
    never read its K and V. Under the causal rule (key j <= query i) every tile above the
    diagonal is such a tile, and every tile wholly below it is fully allowed, so needs no mask.
    Only tiles the diagonal crosses (or an explicit mask cuts) pay for the mask: with n = T·block
    rows a side and block_q == block_k > 1, T(T+1)/2 of the T² tiles are computed, T of them masked.

Conventions
    - mask (n_q, n_k) is True where a query may attend a key; causal is top-left aligned (also
      when n_q != n_k); the two combine with AND. Edge tiles are cut to the array bounds.
      Top-left is torch's is_causal=True. Moving on, beware: the flash-attn library (since 2.1)
      and torch's causal_lower_right align the diagonal bottom-right when n_q != n_k (query i
      sees key j iff j <= i + n_k - n_q); the two agree only when n_q == n_k.
    - A row may see only -inf in its first tiles: while m = -inf, shift by 0 (as in exercise 01).
    - A fully masked row: o = 0, lse = -inf, never NaN. float32 in gives float32 out.

Worked example
    n_q = n_k = 4, block_q = block_k = 2, causal: tile_schedule gives
    [(0, 0, True), (1, 0, False), (1, 1, True)]; tile (0, 1) is skipped: queries 0-1 see no key 2-3.
"""
import math

import numpy as np


def num_blocks(n: int, block: int) -> int:
    """How many blocks of `block` rows cover n rows: a ragged last block counts too."""
    return math.ceil(n / block)


def block_slice(index: int, block: int, n: int) -> slice:
    """The rows of block `index` when n rows are cut into blocks of `block`; the last may be shorter."""
    return slice(index * block, min((index + 1) * block, n))


def tile_allowed(rows: slice, cols: slice, causal: bool = False, mask: np.ndarray | None = None) -> np.ndarray:
    """Which pairs of one tile may attend: bool (rows, cols), True where query i may attend key j.

    `rows` and `cols` are slices of the query and key indices, already cut to the bounds.
    """
    # TODO: start from the tile of the explicit mask (all True without one), then AND the causal rule.
    # BEGIN SOLUTION
    shape = (rows.stop - rows.start, cols.stop - cols.start)
    allowed = np.ones(shape, dtype=bool) if mask is None else mask[rows, cols]
    if causal:
        # Top-left aligned: query i sees key j iff j <= i, whatever n_q and n_k are.
        i, j = np.arange(rows.start, rows.stop), np.arange(cols.start, cols.stop)
        allowed = allowed & (j[None, :] <= i[:, None])
    return allowed
    # END SOLUTION


def tile_schedule(n_q: int, n_k: int, block_q: int, block_k: int, causal: bool = False,
                  mask: np.ndarray | None = None) -> list[tuple[int, int, bool]]:
    """The tiles worth computing, as (i, j, needs_mask): query block i ascending, then key block j.

    A tile is listed iff at least one pair in it may attend; needs_mask is True iff at least one
    pair in it may not. i, j are Python ints and needs_mask a Python bool.
    """
    # TODO: look at every tile's allowed pairs; keep the tiles with any, and note if not all.
    # BEGIN SOLUTION
    schedule = []
    for i in range(num_blocks(n_q, block_q)):
        rows = block_slice(i, block_q, n_q)
        for j in range(num_blocks(n_k, block_k)):
            allowed = tile_allowed(rows, block_slice(j, block_k, n_k), causal, mask)
            if allowed.any():
                schedule.append((i, j, not allowed.all()))
    return schedule
    # END SOLUTION


def tiled_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, block_q: int, block_k: int,
                    causal: bool = False, mask: np.ndarray | None = None,
                    scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """softmax(scale · q kᵀ) v, one scheduled tile at a time.

    q (n_q, d), k (n_k, d), v (n_k, d_v), mask (n_q, n_k) bool or None; scale defaults to 1/sqrt(d).
    Returns o (n_q, d_v) and lse (n_q,), in the dtype of q. Tiles not scheduled are never read.
    """
    # TODO: keep m, l, acc per query row; walk tile_schedule; mask only where needs_mask;
    #       rescale l and acc whenever m grows; divide once at the end.
    # BEGIN SOLUTION
    n_q, n_k = q.shape[0], k.shape[0]
    scale = 1.0 / math.sqrt(q.shape[1]) if scale is None else scale
    # Per query row, in the dtype of q: float32 in gives float32 out.
    m = np.full(n_q, -np.inf, dtype=q.dtype)
    l = np.zeros(n_q, dtype=q.dtype)
    acc = np.zeros((n_q, v.shape[1]), dtype=q.dtype)
    for i, j, needs_mask in tile_schedule(n_q, n_k, block_q, block_k, causal, mask):
        rows, cols = block_slice(i, block_q, n_q), block_slice(j, block_k, n_k)
        s = scale * (q[rows] @ k[cols].T)
        if needs_mask:
            s = np.where(tile_allowed(rows, cols, causal, mask), s, -np.inf)
        m_new = np.maximum(m[rows], s.max(axis=1))
        # A row that has seen only -inf so far shifts by 0: exp(-inf - 0) = 0, not NaN.
        shift = np.where(np.isneginf(m_new), 0, m_new)
        p = np.exp(s - shift[:, None])
        # l and acc were summed against the old max; exp(m_old - m_new) moves them to the new one.
        alpha = np.exp(m[rows] - shift)
        l[rows] = alpha * l[rows] + p.sum(axis=1)
        acc[rows] = alpha[:, None] * acc[rows] + p @ v[cols]
        m[rows] = m_new
    # The one division. A fully masked row has l = 0 and acc = 0: 0 / 1 = 0.
    o = acc / np.where(l == 0, 1, l)[:, None]
    with np.errstate(divide="ignore"):  # log(0) = -inf is the lse of a fully masked row
        lse = m + np.log(l)
    return o, lse
    # END SOLUTION
