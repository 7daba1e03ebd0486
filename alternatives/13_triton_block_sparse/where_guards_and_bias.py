"""Alternative: the forward masks by adding a bias of 0 or -inf, and guards p and alpha with tl.where instead of subtracting 0.

A masked tile adds tl.where(allowed, 0, -inf) to the scores (already times qk_scale); a row whose
max is still -inf gets p = 0 and alpha = 1 from tl.where, while m itself stays -inf. Each trip
reads its own tile's start at its top, from whichever list it lies in.
"""
import triton
import triton.language as tl

from kata.given import masks, tiles


@triton.jit
def _fwd_tiles(acc, l, m, q, k_desc, v_desc, b, h, rows, full, n_full, partial, n_partial, unmasked, n_q, n_k,
               qk_scale, window, doc_ids, MOD: tl.constexpr, RAGGED: tl.constexpr, BLOCK_K: tl.constexpr,
               BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr):
    """Fold the key blocks full[:n_full], then partial[:n_partial], into the running state of one
    query tile, BLOCK_N keys at a time. Returns acc, l, m (m in base-2 units)."""
    offs_n = tl.arange(0, BLOCK_N)
    per_block = BLOCK_K // BLOCK_N
    for t in tl.range(0, (n_full + n_partial) * per_block):
        e = t // per_block
        block = tl.load(full + e) if e < n_full else tl.load(partial + e - n_full)
        start = block * BLOCK_K + t % per_block * BLOCK_N
        keys = start + offs_n
        k = tiles.load_tile(k_desc, b, h, start, BLOCK_N, HEAD_DIM)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        if e >= unmasked:
            allowed = masks.tile_allowed(MOD, rows, keys, n_q, n_k, window, doc_ids, RAGGED)
            s += tl.where(allowed, 0.0, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        empty = m_new == float("-inf")  # a row that has seen no key yet: weights 0, its (zero) sums kept
        p = tl.where(empty[:, None], 0.0, tl.math.exp2(s - m_new[:, None]))
        alpha = tl.where(empty, 1.0, tl.math.exp2(m - m_new))
        l = l * alpha + tl.sum(p, 1)
        v = tiles.load_tile(v_desc, b, h, start, BLOCK_N, HEAD_DIM)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m = m_new
    return acc, l, m
