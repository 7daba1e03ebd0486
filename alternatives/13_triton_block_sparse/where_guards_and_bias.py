"""Alternative: the forward masks by adding a bias of 0 or -inf, and guards p and alpha with tl.where instead of subtracting 0.

A MASKED tile adds tl.where(allowed, 0, -inf) to the scores (already times qk_scale); a row whose
max is still -inf gets p = 0 and alpha = 1 from tl.where, while m itself stays -inf.
"""
import triton
import triton.language as tl

from kata.given import masks, tiles


@triton.jit
def _fwd_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, indices, lo, hi, n_q, n_k,
               qk_scale, window, doc_ids, MOD: tl.constexpr, MASKED: tl.constexpr,
               BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """Fold the key blocks indices[lo:hi] into the running state of one query tile, BLOCK_N keys at a time.

    Returns acc, l, m (m in base-2 units)."""
    offs_n = tl.arange(0, BLOCK_N)
    per_block = BLOCK_K // BLOCK_N
    for t in tl.range(lo * per_block, hi * per_block):
        start = tl.load(indices + t // per_block) * BLOCK_K + t % per_block * BLOCK_N
        keys = start + offs_n
        k = tiles.load_rows(k_ptrs + start * stride_kn, keys, n_k, MASKED)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        if MASKED:
            allowed = masks.tile_allowed(MOD, rows, keys, n_q, n_k, window, doc_ids)
            s += tl.where(allowed, 0.0, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        if MASKED:  # a row that has seen no key yet: weights 0, and its (zero) sums kept as they are
            empty = m_new == float("-inf")
            p = tl.where(empty[:, None], 0.0, tl.math.exp2(s - m_new[:, None]))
            alpha = tl.where(empty, 1.0, tl.math.exp2(m - m_new))
        else:
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        v = tiles.load_rows(v_ptrs + start * stride_vn, keys, n_k, MASKED)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m = m_new
    return acc, l, m
