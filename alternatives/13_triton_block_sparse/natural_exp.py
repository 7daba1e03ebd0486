"""Alternative: natural exp (tl.exp) in every kernel, the running max and lse in natural units.

The kernels undo the wrapper's log2(e) factor: scores are scale · q kᵀ, lse = m + log l.
"""
import triton
import triton.language as tl

from kata.given import masks, tiles


@triton.jit
def _fwd_tiles(acc, l, m, q, k_desc, v_desc, b, h, rows, full, n_full, partial, n_partial, unmasked, n_q, n_k,
               qk_scale, window, doc_ids, MOD: tl.constexpr, RAGGED: tl.constexpr, BLOCK_K: tl.constexpr,
               BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr):
    """Fold the key blocks full[:n_full], then partial[:n_partial], into the running state of one query
    tile, BLOCK_N keys at a time; the first `unmasked` full blocks without the mask.

    As 06's attn_tiles, with the keys taken from the lists. A masked tile lets tile_allowed decide
    which scores stay (the mask and, where RAGGED, the arrays' ends). Returns acc, l, m (m in natural
    units).
    """
    offs_n = tl.arange(0, BLOCK_N)
    scale = qk_scale * 0.6931471805599453  # the wrapper's factor undone
    per_block = BLOCK_K // BLOCK_N
    start = _tile_start(full, n_full, partial, n_partial, 0, BLOCK_K, BLOCK_N)
    for t in tl.range(0, (n_full + n_partial) * per_block):
        keys = start + offs_n
        k = tiles.load_tile(k_desc, b, h, start, BLOCK_N, HEAD_DIM)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if t >= unmasked * per_block:
            s = tl.where(masks.tile_allowed(MOD, rows, keys, n_q, n_k, window, doc_ids, RAGGED), s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1) * scale)
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet: weights 0, not NaN
        p = tl.exp(s * scale - m_sub[:, None])
        alpha = tl.exp(m - m_sub)
        l = l * alpha + tl.sum(p, 1)
        v = tiles.load_tile(v_desc, b, h, start, BLOCK_N, HEAD_DIM)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m = m_new
        start = _tile_start(full, n_full, partial, n_partial, t + 1, BLOCK_K, BLOCK_N)  # a trip ahead
    return acc, l, m


@triton.jit
def _sparse_fwd(ORDER, q_desc, k_desc, v_desc, O, LSE, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, window, doc_ids,
                qk_scale, stride_ob, stride_oh, stride_on, stride_lse, H, n_q, n_k, t_c,
                MOD: tl.constexpr, RAGGED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
                BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """As the solution's, with lse = m + log l in natural units."""
    bh, i, tile = _program_tile(ORDER, n_q, BLOCK_Q, BLOCK_M)
    b = bh // H
    h = bh % H
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    q = tiles.load_tile(q_desc, b, h, tile * BLOCK_M, BLOCK_M, HEAD_DIM)
    full, partial = FULL_IDX + i * t_c, KV_IDX + i * t_c
    n_full, n_partial = tl.load(FULL_NUM + i), tl.load(KV_NUM + i)
    unmasked = n_full - masks.ends_ragged(full, n_full, n_k, BLOCK_K)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    acc, l, m = _fwd_tiles(acc, l, m, q, k_desc, v_desc, b, h, rows, full, n_full, partial, n_partial, unmasked,
                           n_q, n_k, qk_scale, window, doc_ids, MOD, RAGGED, BLOCK_K, BLOCK_N, HEAD_DIM, PRECISION)

    o = acc / tl.where(l == 0, 1.0, l)[:, None]
    lse = m + tl.log(l)  # l = 0: log(0) = -inf
    o_ptrs = tiles.row_ptrs(O, b, h, stride_ob, stride_oh, stride_on, rows, HEAD_DIM)
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=(rows < n_q)[:, None])
    tl.store(LSE + bh.to(tl.int64) * stride_lse + rows, lse, mask=rows < n_q)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, keys, q_desc, do_desc, stats_desc, b, h, full, n_full, partial, n_partial, unmasked,
                n_q, n_k, qk_scale, window, doc_ids, MOD: tl.constexpr, RAGGED: tl.constexpr, BLOCK_Q: tl.constexpr,
                BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr):
    """Add the query blocks full[:n_full], then partial[:n_partial], BLOCK_M rows at a time, into the
    float32 sums dk, dv of one key tile; the first `unmasked` full blocks without the mask. As 09's
    _dkdv_tiles (transposed tiles, keys on rows), the rows from the lists."""
    offs_m = tl.arange(0, BLOCK_M)
    scale = qk_scale * 0.6931471805599453  # the wrapper's factor undone
    per_block = BLOCK_Q // BLOCK_M
    start = _tile_start(full, n_full, partial, n_partial, 0, BLOCK_Q, BLOCK_M)
    for t in tl.range(0, (n_full + n_partial) * per_block):
        rows = start + offs_m
        q = tiles.load_tile(q_desc, b, h, start, BLOCK_M, HEAD_DIM)
        do = tiles.load_tile(do_desc, b, h, start, BLOCK_M, HEAD_DIM)
        lse, delta = tiles.load_stats(stats_desc, b, h, start, BLOCK_M)
        p_t = tl.exp(tl.dot(k, tl.trans(q), input_precision=PRECISION) * scale - lse[None, :])
        if t >= unmasked * per_block:  # where, not a product: a fully masked row has lse = -inf, so P = inf there
            p_t = tl.where(tl.trans(masks.tile_allowed(MOD, rows, keys, n_q, n_k, window, doc_ids, RAGGED)), p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION)
        ds_t = p_t * (tl.dot(v, tl.trans(do), input_precision=PRECISION) - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=PRECISION)
        start = _tile_start(full, n_full, partial, n_partial, t + 1, BLOCK_Q, BLOCK_M)
    return dk, dv


@triton.jit
def _dq_tiles(dq, q, do, lse2, delta, rows, k_desc, v_desc, b, h, full, n_full, partial, n_partial, unmasked,
              n_q, n_k, qk_scale, window, doc_ids, MOD: tl.constexpr, RAGGED: tl.constexpr, BLOCK_K: tl.constexpr,
              BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr):
    """Add the key blocks full[:n_full], then partial[:n_partial], BLOCK_N keys at a time, into the
    float32 sum dq of one query tile; the first `unmasked` full blocks without the mask. As 09's
    _dq_tiles, the keys from the lists."""
    offs_n = tl.arange(0, BLOCK_N)
    scale = qk_scale * 0.6931471805599453  # the wrapper's factor undone
    per_block = BLOCK_K // BLOCK_N
    start = _tile_start(full, n_full, partial, n_partial, 0, BLOCK_K, BLOCK_N)
    for t in tl.range(0, (n_full + n_partial) * per_block):
        keys = start + offs_n
        k = tiles.load_tile(k_desc, b, h, start, BLOCK_N, HEAD_DIM)
        v = tiles.load_tile(v_desc, b, h, start, BLOCK_N, HEAD_DIM)
        p = tl.exp(tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale - lse2[:, None])
        if t >= unmasked * per_block:
            p = tl.where(masks.tile_allowed(MOD, rows, keys, n_q, n_k, window, doc_ids, RAGGED), p, 0.0)
        ds = p * (tl.dot(do, tl.trans(v), input_precision=PRECISION) - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
        start = _tile_start(full, n_full, partial, n_partial, t + 1, BLOCK_K, BLOCK_N)
    return dq


@triton.jit
def _sparse_dq(ORDER, q_desc, k_desc, v_desc, do_desc, o_desc, DQ, LSE, DELTA, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX,
               window, doc_ids, qk_scale, scale, stride_dqb, stride_dqh, stride_dqn, stride_lse, H, n_q, n_k, t_c,
               MOD: tl.constexpr, RAGGED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
               BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """As the solution's, with lse left in natural units."""
    bh, i, tile = _program_tile(ORDER, n_q, BLOCK_Q, BLOCK_M)
    b = bh // H
    h = bh % H
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    q = tiles.load_tile(q_desc, b, h, tile * BLOCK_M, BLOCK_M, HEAD_DIM)
    do = tiles.load_tile(do_desc, b, h, tile * BLOCK_M, BLOCK_M, HEAD_DIM)
    lse2 = tl.load(LSE + bh.to(tl.int64) * stride_lse + rows, mask=rows < n_q, other=0.0)
    o = tiles.load_tile(o_desc, b, h, tile * BLOCK_M, BLOCK_M, HEAD_DIM)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)  # D = rowsum(dO ∘ O), here and for dK, dV
    tl.store(DELTA + bh.to(tl.int64) * stride_lse + rows, delta, mask=rows < n_q)
    full, partial = FULL_IDX + i * t_c, KV_IDX + i * t_c
    n_full, n_partial = tl.load(FULL_NUM + i), tl.load(KV_NUM + i)
    unmasked = n_full - masks.ends_ragged(full, n_full, n_k, BLOCK_K)

    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    dq = _dq_tiles(dq, q, do, lse2, delta, rows, k_desc, v_desc, b, h, full, n_full, partial, n_partial, unmasked,
                   n_q, n_k, qk_scale, window, doc_ids, MOD, RAGGED, BLOCK_K, BLOCK_N, HEAD_DIM, PRECISION)
    dq_ptrs = tiles.row_ptrs(DQ, b, h, stride_dqb, stride_dqh, stride_dqn, rows, HEAD_DIM)
    tl.store(dq_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=(rows < n_q)[:, None])
