"""Alternative: the dK, dV kernel builds P and dS query-major (as the forward does) and transposes them for tl.dot.

The sums are added with += rather than through tl.dot's accumulator, and each trip reads its own
tile's start at its top.
"""
import triton
import triton.language as tl

from kata.given import masks, tiles


@triton.jit
def _dkdv_tiles(dk, dv, k, v, keys, q_desc, do_desc, stats_desc, b, h, full, n_full, partial, n_partial, unmasked,
                n_q, n_k, qk_scale, window, doc_ids, MOD: tl.constexpr, RAGGED: tl.constexpr, BLOCK_Q: tl.constexpr,
                BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr):
    """Add the query blocks full[:n_full], then partial[:n_partial], BLOCK_M rows at a time, into the
    float32 sums dk, dv of one key tile: P (BLOCK_M, BLOCK_N) queries on rows, dv += Pᵀ dO, dk += dSᵀ q."""
    offs_m = tl.arange(0, BLOCK_M)
    per_block = BLOCK_Q // BLOCK_M
    for t in tl.range(0, (n_full + n_partial) * per_block):
        e = t // per_block
        block = tl.load(full + e) if e < n_full else tl.load(partial + e - n_full)
        start = block * BLOCK_Q + t % per_block * BLOCK_M
        rows = start + offs_m
        q = tiles.load_tile(q_desc, b, h, start, BLOCK_M, HEAD_DIM)
        do = tiles.load_tile(do_desc, b, h, start, BLOCK_M, HEAD_DIM)
        lse, delta = tiles.load_stats(stats_desc, b, h, start, BLOCK_M)
        p = tl.math.exp2(tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale - lse[:, None] * 1.4426950408889634)
        if e >= unmasked:  # where, not a product: lse = -inf on a fully masked row, so P = inf there
            p = tl.where(masks.tile_allowed(MOD, rows, keys, n_q, n_k, window, doc_ids, RAGGED), p, 0.0)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
        ds = p * (tl.dot(do, tl.trans(v), input_precision=PRECISION) - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    return dk, dv
