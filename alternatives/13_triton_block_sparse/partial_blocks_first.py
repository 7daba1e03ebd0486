"""Alternative: every kernel walks its partial blocks (masked) before its full ones (unmasked).

The order of the tiles is free (the result is the same up to rounding). Each walk is one loop over
the partial list, then the full list; a tile is masked while it lies in the partial list, or in the
full list's ragged last block (entry `unmasked` on). Each trip reads its own tile's start at its top.
"""
import triton
import triton.language as tl

from kata.given import masks, tiles


@triton.jit
def _partial_first(full, n_full, partial, n_partial, unmasked, t, BLOCK: tl.constexpr, TILE: tl.constexpr):
    """(start, masked) of tile t of the walk partial[:n_partial] then full[:n_full]."""
    per_block = BLOCK // TILE
    e = t // per_block
    in_partial = e < n_partial
    block = tl.load(partial + e) if in_partial else tl.load(full + e - n_partial)
    return block * BLOCK + t % per_block * TILE, in_partial | (e - n_partial >= unmasked)


@triton.jit
def _fwd_tiles(acc, l, m, q, k_desc, v_desc, b, h, rows, full, n_full, partial, n_partial, unmasked, n_q, n_k,
               qk_scale, window, doc_ids, MOD: tl.constexpr, RAGGED: tl.constexpr, BLOCK_K: tl.constexpr,
               BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr):
    """Fold the key blocks partial[:n_partial], then full[:n_full], into the running state of one query
    tile, BLOCK_N keys at a time; the first `unmasked` full blocks without the mask.

    As 06's attn_tiles, with the keys taken from the lists. A masked tile lets tile_allowed decide
    which scores stay (the mask and, where RAGGED, the arrays' ends). Returns acc, l, m (m in base-2
    units).
    """
    offs_n = tl.arange(0, BLOCK_N)
    per_block = BLOCK_K // BLOCK_N
    for t in tl.range(0, (n_full + n_partial) * per_block):
        start, masked = _partial_first(full, n_full, partial, n_partial, unmasked, t, BLOCK_K, BLOCK_N)
        keys = start + offs_n
        k = tiles.load_tile(k_desc, b, h, start, BLOCK_N, HEAD_DIM)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if masked:
            s = tl.where(masks.tile_allowed(MOD, rows, keys, n_q, n_k, window, doc_ids, RAGGED), s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1) * qk_scale)
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet: weights 0, not NaN
        p = tl.math.exp2(s * qk_scale - m_sub[:, None])
        alpha = tl.math.exp2(m - m_sub)
        l = l * alpha + tl.sum(p, 1)
        v = tiles.load_tile(v_desc, b, h, start, BLOCK_N, HEAD_DIM)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m = m_new
    return acc, l, m


@triton.jit
def _dkdv_tiles(dk, dv, k, v, keys, q_desc, do_desc, stats_desc, b, h, full, n_full, partial, n_partial, unmasked,
                n_q, n_k, qk_scale, window, doc_ids, MOD: tl.constexpr, RAGGED: tl.constexpr, BLOCK_Q: tl.constexpr,
                BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr):
    """Add the query blocks partial[:n_partial], then full[:n_full], BLOCK_M rows at a time, into the
    float32 sums dk, dv of one key tile; the first `unmasked` full blocks without the mask. As 09's
    _dkdv_tiles (transposed tiles, keys on rows), the rows from the lists."""
    offs_m = tl.arange(0, BLOCK_M)
    per_block = BLOCK_Q // BLOCK_M
    for t in tl.range(0, (n_full + n_partial) * per_block):
        start, masked = _partial_first(full, n_full, partial, n_partial, unmasked, t, BLOCK_Q, BLOCK_M)
        rows = start + offs_m
        q = tiles.load_tile(q_desc, b, h, start, BLOCK_M, HEAD_DIM)
        do = tiles.load_tile(do_desc, b, h, start, BLOCK_M, HEAD_DIM)
        lse, delta = tiles.load_stats(stats_desc, b, h, start, BLOCK_M)
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale - (lse * 1.4426950408889634)[None, :])
        if masked:  # where, not a product: a fully masked row has lse = -inf, so P = inf there
            p_t = tl.where(tl.trans(masks.tile_allowed(MOD, rows, keys, n_q, n_k, window, doc_ids, RAGGED)), p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION)
        ds_t = p_t * (tl.dot(v, tl.trans(do), input_precision=PRECISION) - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=PRECISION)
    return dk, dv


@triton.jit
def _dq_tiles(dq, q, do, lse2, delta, rows, k_desc, v_desc, b, h, full, n_full, partial, n_partial, unmasked,
              n_q, n_k, qk_scale, window, doc_ids, MOD: tl.constexpr, RAGGED: tl.constexpr, BLOCK_K: tl.constexpr,
              BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr):
    """Add the key blocks partial[:n_partial], then full[:n_full], BLOCK_N keys at a time, into the
    float32 sum dq of one query tile; the first `unmasked` full blocks without the mask. As 09's
    _dq_tiles, the keys from the lists."""
    offs_n = tl.arange(0, BLOCK_N)
    per_block = BLOCK_K // BLOCK_N
    for t in tl.range(0, (n_full + n_partial) * per_block):
        start, masked = _partial_first(full, n_full, partial, n_partial, unmasked, t, BLOCK_K, BLOCK_N)
        keys = start + offs_n
        k = tiles.load_tile(k_desc, b, h, start, BLOCK_N, HEAD_DIM)
        v = tiles.load_tile(v_desc, b, h, start, BLOCK_N, HEAD_DIM)
        p = tl.math.exp2(tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale - lse2[:, None])
        if masked:
            p = tl.where(masks.tile_allowed(MOD, rows, keys, n_q, n_k, window, doc_ids, RAGGED), p, 0.0)
        ds = p * (tl.dot(do, tl.trans(v), input_precision=PRECISION) - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
    return dq
