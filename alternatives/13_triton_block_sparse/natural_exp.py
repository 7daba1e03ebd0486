"""Alternative: natural exp (tl.exp) in every kernel, the running max and lse in natural units.

The kernels undo the wrapper's log2(e) factor: scores are scale · q kᵀ, lse = m + log l.
"""
import triton
import triton.language as tl

from kata.given import masks, tiles

@triton.jit
def _fwd_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, indices, lo, hi, n_q, n_k,
               qk_scale, window, doc_ids, MOD: tl.constexpr, MASKED: tl.constexpr,
               BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """Fold the key blocks indices[lo:hi] into the running state of one query tile, BLOCK_N keys at a time.

    Returns acc, l, m (m in natural units: the scores are qk_scale · ln 2 · q kᵀ).
    """
    offs_n = tl.arange(0, BLOCK_N)
    per_block = BLOCK_K // BLOCK_N
    scale = qk_scale * 0.6931471805599453  # scale · log2(e) · ln 2 = scale
    for t in tl.range(lo * per_block, hi * per_block):
        start = tl.load(indices + t // per_block) * BLOCK_K + t % per_block * BLOCK_N
        keys = start + offs_n
        k = tiles.load_rows(k_ptrs + start * stride_kn, keys, n_k, MASKED)
        s = tl.dot(q, tl.trans(k)) * scale
        if MASKED:
            s = tl.where(masks.tile_allowed(MOD, rows, keys, n_q, n_k, window, doc_ids), s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_sub = m_new
        if MASKED:  # a row that has seen no key yet subtracts 0, not -inf
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_sub[:, None])
        alpha = tl.exp(m - m_sub)
        l = l * alpha + tl.sum(p, 1)
        v = tiles.load_rows(v_ptrs + start * stride_vn, keys, n_k, MASKED)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m = m_new
    return acc, l, m


@triton.jit
def _sparse_fwd(Q, K, V, O, LSE, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, window, doc_ids, qk_scale,
                stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
                H, n_q, n_k, t_c,
                MOD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: BLOCK_M query rows (a slice of query block i) of one (batch, head); lse = m + log l."""
    n_tiles = tl.cdiv(n_q, BLOCK_M)
    bh = tl.program_id(0) // n_tiles
    tile = n_tiles - 1 - tl.program_id(0) % n_tiles
    b = bh // H
    h = bh % H
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    i = tile * BLOCK_M // BLOCK_Q
    q = tiles.load_rows(tiles.row_ptrs(Q, b, h, stride_qb, stride_qh, stride_qn, rows, HEAD_DIM), rows, n_q, True)
    k_ptrs = tiles.row_ptrs(K, b, h, stride_kb, stride_kh, stride_kn, tl.arange(0, BLOCK_N), HEAD_DIM)
    v_ptrs = tiles.row_ptrs(V, b, h, stride_vb, stride_vh, stride_vn, tl.arange(0, BLOCK_N), HEAD_DIM)
    full_idx = FULL_IDX + i * t_c
    n_full = tl.load(FULL_NUM + i)
    unmasked = n_full - masks.ends_ragged(full_idx, n_full, n_k, BLOCK_K)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    acc, l, m = _fwd_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, full_idx, 0, unmasked,
                           n_q, n_k, qk_scale, window, doc_ids, MOD, False, BLOCK_K, BLOCK_N)
    acc, l, m = _fwd_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, full_idx, unmasked, n_full,
                           n_q, n_k, qk_scale, window, doc_ids, MOD, True, BLOCK_K, BLOCK_N)
    acc, l, m = _fwd_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, KV_IDX + i * t_c, 0,
                           tl.load(KV_NUM + i), n_q, n_k, qk_scale, window, doc_ids, MOD, True, BLOCK_K, BLOCK_N)

    o = acc / tl.where(l == 0, 1.0, l)[:, None]
    lse = m + tl.log(l)  # l = 0: log(0) = -inf
    o_ptrs = tiles.row_ptrs(O, b, h, stride_ob, stride_oh, stride_on, rows, HEAD_DIM)
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=(rows < n_q)[:, None])
    tl.store(LSE + bh.to(tl.int64) * n_q + rows, lse, mask=rows < n_q)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, keys, q_ptrs, do_ptrs, stride_qn, stride_don, LSE, DELTA, indices, lo, hi,
                n_q, n_k, qk_scale, window, doc_ids, MOD: tl.constexpr, MASKED: tl.constexpr,
                BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr):
    """Add the query blocks indices[lo:hi], BLOCK_M rows at a time, into dk, dv; Pᵀ = exp(scale · k qᵀ − lse)."""
    offs_m = tl.arange(0, BLOCK_M)
    per_block = BLOCK_Q // BLOCK_M
    scale = qk_scale * 0.6931471805599453
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
        p_t = tl.exp(tl.dot(k, tl.trans(q)) * scale - lse[None, :])
        if MASKED:
            p_t = tl.where(tl.trans(masks.tile_allowed(MOD, rows, keys, n_q, n_k, window, doc_ids)), p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        ds_t = p_t * (tl.dot(v, tl.trans(do)) - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def _dq_tiles(dq, q, do, lse, delta, rows, k_ptrs, v_ptrs, stride_kn, stride_vn, indices, lo, hi, n_q, n_k,
              qk_scale, window, doc_ids, MOD: tl.constexpr, MASKED: tl.constexpr,
              BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """Add the key blocks indices[lo:hi], BLOCK_N keys at a time, into dq; P = exp(scale · q kᵀ − lse)."""
    offs_n = tl.arange(0, BLOCK_N)
    per_block = BLOCK_K // BLOCK_N
    scale = qk_scale * 0.6931471805599453
    for t in tl.range(lo * per_block, hi * per_block):
        start = tl.load(indices + t // per_block) * BLOCK_K + t % per_block * BLOCK_N
        keys = start + offs_n
        k = tiles.load_rows(k_ptrs + start * stride_kn, keys, n_k, MASKED)
        v = tiles.load_rows(v_ptrs + start * stride_vn, keys, n_k, MASKED)
        p = tl.exp(tl.dot(q, tl.trans(k)) * scale - lse[:, None])
        if MASKED:
            p = tl.where(masks.tile_allowed(MOD, rows, keys, n_q, n_k, window, doc_ids), p, 0.0)
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def _sparse_dq(Q, K, V, DO, DQ, LSE, DELTA, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, window, doc_ids,
               qk_scale, scale,
               stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
               stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
               stride_dqb, stride_dqh, stride_dqn,
               H, n_q, n_k, t_c,
               MOD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: dQ of BLOCK_M query rows of one (batch, head); lse kept in natural units."""
    n_tiles = tl.cdiv(n_q, BLOCK_M)
    bh = tl.program_id(0) // n_tiles
    tile = n_tiles - 1 - tl.program_id(0) % n_tiles
    b = bh // H
    h = bh % H
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    i = tile * BLOCK_M // BLOCK_Q
    q = tiles.load_rows(tiles.row_ptrs(Q, b, h, stride_qb, stride_qh, stride_qn, rows, HEAD_DIM), rows, n_q, True)
    do = tiles.load_rows(tiles.row_ptrs(DO, b, h, stride_dob, stride_doh, stride_don, rows, HEAD_DIM), rows, n_q, True)
    lse = tl.load(LSE + bh.to(tl.int64) * n_q + rows, mask=rows < n_q, other=0.0)
    delta = tl.load(DELTA + bh.to(tl.int64) * n_q + rows, mask=rows < n_q, other=0.0)
    k_ptrs = tiles.row_ptrs(K, b, h, stride_kb, stride_kh, stride_kn, tl.arange(0, BLOCK_N), HEAD_DIM)
    v_ptrs = tiles.row_ptrs(V, b, h, stride_vb, stride_vh, stride_vn, tl.arange(0, BLOCK_N), HEAD_DIM)
    full_idx = FULL_IDX + i * t_c
    n_full = tl.load(FULL_NUM + i)
    unmasked = n_full - masks.ends_ragged(full_idx, n_full, n_k, BLOCK_K)

    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    dq = _dq_tiles(dq, q, do, lse, delta, rows, k_ptrs, v_ptrs, stride_kn, stride_vn, full_idx, 0, unmasked,
                   n_q, n_k, qk_scale, window, doc_ids, MOD, False, BLOCK_K, BLOCK_N)
    dq = _dq_tiles(dq, q, do, lse, delta, rows, k_ptrs, v_ptrs, stride_kn, stride_vn, full_idx, unmasked, n_full,
                   n_q, n_k, qk_scale, window, doc_ids, MOD, True, BLOCK_K, BLOCK_N)
    dq = _dq_tiles(dq, q, do, lse, delta, rows, k_ptrs, v_ptrs, stride_kn, stride_vn, KV_IDX + i * t_c, 0,
                   tl.load(KV_NUM + i), n_q, n_k, qk_scale, window, doc_ids, MOD, True, BLOCK_K, BLOCK_N)
    dq_ptrs = tiles.row_ptrs(DQ, b, h, stride_dqb, stride_dqh, stride_dqn, rows, HEAD_DIM)
    tl.store(dq_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=(rows < n_q)[:, None])
