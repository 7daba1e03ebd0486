"""Alternative: every kernel walks its partial blocks (MASKED) before its full ones (unmasked).

The order of the tiles is free (the result is the same up to rounding). The partial tiles may leave
a row's m at -inf; the unmasked full tiles that follow give every row a finite max, so their alpha =
exp2(-inf - m_new) = 0 and no guard is needed outside the MASKED tiles.
"""
import triton
import triton.language as tl

from kata.given import masks, tiles


@triton.jit
def _sparse_fwd(Q, K, V, O, LSE, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, window, doc_ids, qk_scale,
                stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
                H, n_q, n_k, t_c,
                MOD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: BLOCK_M query rows (a slice of query block i) of one (batch, head); partial blocks first.

    Program p owns batch·head p // cdiv(n_q, BLOCK_M) and row tile p % cdiv(n_q, BLOCK_M). The lists
    (T_r,) and (T_r, T_c) int32, row i at KV_IDX + i·t_c. LSE (B, H, n_q) contiguous float32.
    """
    n_tiles = tl.cdiv(n_q, BLOCK_M)
    bh = tl.program_id(0) // n_tiles
    tile = n_tiles - 1 - tl.program_id(0) % n_tiles  # causal: the last rows have the most tiles, so run first
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
    acc, l, m = _fwd_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, KV_IDX + i * t_c, 0,
                           tl.load(KV_NUM + i), n_q, n_k, qk_scale, window, doc_ids, MOD, True, BLOCK_K, BLOCK_N)
    acc, l, m = _fwd_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, full_idx, 0, unmasked,
                           n_q, n_k, qk_scale, window, doc_ids, MOD, False, BLOCK_K, BLOCK_N)
    acc, l, m = _fwd_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, full_idx, unmasked, n_full,
                           n_q, n_k, qk_scale, window, doc_ids, MOD, True, BLOCK_K, BLOCK_N)

    o = acc / tl.where(l == 0, 1.0, l)[:, None]
    lse = (m + tl.math.log2(l)) * 0.6931471805599453  # l = 0: log2(0) = -inf
    o_ptrs = tiles.row_ptrs(O, b, h, stride_ob, stride_oh, stride_on, rows, HEAD_DIM)
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=(rows < n_q)[:, None])
    tl.store(LSE + bh.to(tl.int64) * n_q + rows, lse, mask=rows < n_q)


@triton.jit
def _sparse_dkdv(Q, K, V, DO, DK, DV, LSE, DELTA, Q_NUM, Q_IDX, FULL_NUM, FULL_IDX, window, doc_ids,
                 qk_scale, scale,
                 stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                 stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
                 stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                 H, n_q, n_k, t_r,
                 MOD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: dK, dV of BLOCK_N keys (a slice of key block j) of one (batch, head), partial
    blocks first, over the transposed lists, row j at Q_IDX + j·t_r. LSE, DELTA (B, H, n_q) contiguous float32."""
    n_tiles = tl.cdiv(n_k, BLOCK_N)
    bh = tl.program_id(0) // n_tiles
    tile = tl.program_id(0) % n_tiles
    b = bh // H
    h = bh % H
    keys = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tile * BLOCK_N // BLOCK_K
    k = tiles.load_rows(tiles.row_ptrs(K, b, h, stride_kb, stride_kh, stride_kn, keys, HEAD_DIM), keys, n_k, True)
    v = tiles.load_rows(tiles.row_ptrs(V, b, h, stride_vb, stride_vh, stride_vn, keys, HEAD_DIM), keys, n_k, True)
    q_ptrs = tiles.row_ptrs(Q, b, h, stride_qb, stride_qh, stride_qn, tl.arange(0, BLOCK_M), HEAD_DIM)
    do_ptrs = tiles.row_ptrs(DO, b, h, stride_dob, stride_doh, stride_don, tl.arange(0, BLOCK_M), HEAD_DIM)
    LSE += bh.to(tl.int64) * n_q
    DELTA += bh.to(tl.int64) * n_q
    full_idx = FULL_IDX + j * t_r
    n_full = tl.load(FULL_NUM + j)
    unmasked = n_full - masks.ends_ragged(full_idx, n_full, n_q, BLOCK_Q)

    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dk, dv = _dkdv_tiles(dk, dv, k, v, keys, q_ptrs, do_ptrs, stride_qn, stride_don, LSE, DELTA,
                         Q_IDX + j * t_r, 0, tl.load(Q_NUM + j), n_q, n_k, qk_scale, window, doc_ids, MOD, True,
                         BLOCK_Q, BLOCK_M)
    dk, dv = _dkdv_tiles(dk, dv, k, v, keys, q_ptrs, do_ptrs, stride_qn, stride_don, LSE, DELTA, full_idx,
                         0, unmasked, n_q, n_k, qk_scale, window, doc_ids, MOD, False, BLOCK_Q, BLOCK_M)
    dk, dv = _dkdv_tiles(dk, dv, k, v, keys, q_ptrs, do_ptrs, stride_qn, stride_don, LSE, DELTA, full_idx,
                         unmasked, n_full, n_q, n_k, qk_scale, window, doc_ids, MOD, True, BLOCK_Q, BLOCK_M)
    dk_ptrs = tiles.row_ptrs(DK, b, h, stride_dkb, stride_dkh, stride_dkn, keys, HEAD_DIM)
    dv_ptrs = tiles.row_ptrs(DV, b, h, stride_dvb, stride_dvh, stride_dvn, keys, HEAD_DIM)
    tl.store(dk_ptrs, (dk * scale).to(DK.dtype.element_ty), mask=(keys < n_k)[:, None])
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=(keys < n_k)[:, None])


@triton.jit
def _sparse_dq(Q, K, V, DO, DQ, LSE, DELTA, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, window, doc_ids,
               qk_scale, scale,
               stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
               stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
               stride_dqb, stride_dqh, stride_dqn,
               H, n_q, n_k, t_c,
               MOD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: dQ of BLOCK_M query rows (a slice of query block i) of one (batch, head), partial
    blocks first, over the forward's lists."""
    n_tiles = tl.cdiv(n_q, BLOCK_M)
    bh = tl.program_id(0) // n_tiles
    tile = n_tiles - 1 - tl.program_id(0) % n_tiles  # causal: the last rows have the most tiles, so run first
    b = bh // H
    h = bh % H
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    i = tile * BLOCK_M // BLOCK_Q
    q = tiles.load_rows(tiles.row_ptrs(Q, b, h, stride_qb, stride_qh, stride_qn, rows, HEAD_DIM), rows, n_q, True)
    do = tiles.load_rows(tiles.row_ptrs(DO, b, h, stride_dob, stride_doh, stride_don, rows, HEAD_DIM), rows, n_q, True)
    lse2 = tl.load(LSE + bh.to(tl.int64) * n_q + rows, mask=rows < n_q, other=0.0) * 1.4426950408889634
    delta = tl.load(DELTA + bh.to(tl.int64) * n_q + rows, mask=rows < n_q, other=0.0)
    k_ptrs = tiles.row_ptrs(K, b, h, stride_kb, stride_kh, stride_kn, tl.arange(0, BLOCK_N), HEAD_DIM)
    v_ptrs = tiles.row_ptrs(V, b, h, stride_vb, stride_vh, stride_vn, tl.arange(0, BLOCK_N), HEAD_DIM)
    full_idx = FULL_IDX + i * t_c
    n_full = tl.load(FULL_NUM + i)
    unmasked = n_full - masks.ends_ragged(full_idx, n_full, n_k, BLOCK_K)

    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    dq = _dq_tiles(dq, q, do, lse2, delta, rows, k_ptrs, v_ptrs, stride_kn, stride_vn, KV_IDX + i * t_c, 0,
                   tl.load(KV_NUM + i), n_q, n_k, qk_scale, window, doc_ids, MOD, True, BLOCK_K, BLOCK_N)
    dq = _dq_tiles(dq, q, do, lse2, delta, rows, k_ptrs, v_ptrs, stride_kn, stride_vn, full_idx, 0, unmasked,
                   n_q, n_k, qk_scale, window, doc_ids, MOD, False, BLOCK_K, BLOCK_N)
    dq = _dq_tiles(dq, q, do, lse2, delta, rows, k_ptrs, v_ptrs, stride_kn, stride_vn, full_idx, unmasked, n_full,
                   n_q, n_k, qk_scale, window, doc_ids, MOD, True, BLOCK_K, BLOCK_N)
    dq_ptrs = tiles.row_ptrs(DQ, b, h, stride_dqb, stride_dqh, stride_dqn, rows, HEAD_DIM)
    tl.store(dq_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=(rows < n_q)[:, None])
