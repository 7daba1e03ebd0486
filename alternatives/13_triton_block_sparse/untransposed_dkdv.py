"""Alternative: the dK, dV kernel builds P and dS query-major (as the forward does) and transposes them for tl.dot.

The sums are added with += rather than through tl.dot's accumulator.
"""
import triton
import triton.language as tl

from kata.given import masks, tiles


@triton.jit
def _dkdv_tiles(dk, dv, k, v, keys, q_ptrs, do_ptrs, stride_qn, stride_don, LSE, DELTA, indices, lo, hi,
                n_q, n_k, qk_scale, window, doc_ids, MOD: tl.constexpr, MASKED: tl.constexpr,
                BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr):
    """Add the query blocks indices[lo:hi], BLOCK_M rows at a time, into the float32 sums dk, dv
    of one key tile: P (BLOCK_M, BLOCK_N) queries on rows, dv += Pᵀ dO, dk += dSᵀ q."""
    offs_m = tl.arange(0, BLOCK_M)
    per_block = BLOCK_Q // BLOCK_M
    for t in tl.range(lo * per_block, hi * per_block):
        start = tl.load(indices + t // per_block) * BLOCK_Q + t % per_block * BLOCK_M
        rows = start + offs_m
        q = tiles.load_rows(q_ptrs + start * stride_qn, rows, n_q, MASKED)
        do = tiles.load_rows(do_ptrs + start * stride_don, rows, n_q, MASKED)
        if MASKED:
            lse = tl.load(LSE + rows, mask=rows < n_q, other=0.0)
            delta = tl.load(DELTA + rows, mask=rows < n_q, other=0.0)
        else:
            lse = tl.load(LSE + rows)
            delta = tl.load(DELTA + rows)
        p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse[:, None] * 1.4426950408889634)
        if MASKED:  # where, not a product: lse = -inf on a fully masked row, so P = inf there
            p = tl.where(masks.tile_allowed(MOD, rows, keys, n_q, n_k, window, doc_ids), p, 0.0)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    return dk, dv
