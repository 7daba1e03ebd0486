"""Alternative: block-major grids in both backward kernels, blocks in launch order.

Program p owns block p // (B·H) and batch·head p % (B·H)."""
import triton
import triton.language as tl


@triton.jit
def _bwd_dkdv(Q, K, V, DO, DK, DV, LSE, DELTA, qk_scale, scale,
              stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
              stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
              H, n_q, n_k,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              PRECISION: tl.constexpr):
    """One program: dK and dV of one key block (BLOCK_N keys) of one (batch, head).

    Program p owns batch·head p // cdiv(n_k, BLOCK_N) and key block p % cdiv(n_k, BLOCK_N). LSE and
    DELTA (B, H, n_q) contiguous float32. qk_scale = scale · log2(e).
    """
    n_blocks = tl.cdiv(n_k, BLOCK_N)
    batch_heads = tl.num_programs(0) // n_blocks
    bh = tl.program_id(0) % batch_heads
    block = tl.program_id(0) // batch_heads
    b = bh // H
    h = bh % H
    keys = block * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tiles.load_rows(tiles.row_ptrs(K, b, h, stride_kb, stride_kh, stride_kn, keys, HEAD_DIM), keys, n_k, True)
    v = tiles.load_rows(tiles.row_ptrs(V, b, h, stride_vb, stride_vh, stride_vn, keys, HEAD_DIM), keys, n_k, True)
    q_ptrs = tiles.row_ptrs(Q, b, h, stride_qb, stride_qh, stride_qn, tl.arange(0, BLOCK_M), HEAD_DIM)
    do_ptrs = tiles.row_ptrs(DO, b, h, stride_dob, stride_doh, stride_don, tl.arange(0, BLOCK_M), HEAD_DIM)
    LSE += bh.to(tl.int64) * n_q
    DELTA += bh.to(tl.int64) * n_q

    # Three stages: [lo, diagonal) masked, [mid, full) unmasked, [tail, n_q) masked (the ragged end).
    full = n_q // BLOCK_M * BLOCK_M
    lo = 0
    diagonal = 0
    mid = 0
    tail = full
    if CAUSAL:  # queries before the block's first key attend none of it; from its last key on, all of it
        lo = block * BLOCK_N // BLOCK_M * BLOCK_M
        mid = tl.cdiv((block + 1) * BLOCK_N, BLOCK_M) * BLOCK_M
        diagonal = tl.minimum(mid, n_q)
        tail = tl.maximum(mid, full)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dk, dv = _dkdv_tiles(dk, dv, k, v, keys, q_ptrs, do_ptrs, stride_qn, stride_don, LSE, DELTA,
                         lo, diagonal, n_q, qk_scale, True, CAUSAL, BLOCK_M, PRECISION)
    dk, dv = _dkdv_tiles(dk, dv, k, v, keys, q_ptrs, do_ptrs, stride_qn, stride_don, LSE, DELTA,
                         mid, full, n_q, qk_scale, False, CAUSAL, BLOCK_M, PRECISION)
    dk, dv = _dkdv_tiles(dk, dv, k, v, keys, q_ptrs, do_ptrs, stride_qn, stride_don, LSE, DELTA,
                         tail, n_q, n_q, qk_scale, True, CAUSAL, BLOCK_M, PRECISION)

    dk_ptrs = tiles.row_ptrs(DK, b, h, stride_dkb, stride_dkh, stride_dkn, keys, HEAD_DIM)
    dv_ptrs = tiles.row_ptrs(DV, b, h, stride_dvb, stride_dvh, stride_dvn, keys, HEAD_DIM)
    tl.store(dk_ptrs, (dk * scale).to(DK.dtype.element_ty), mask=(keys < n_k)[:, None])
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=(keys < n_k)[:, None])


@triton.jit
def _bwd_dq(Q, K, V, DO, DQ, LSE, DELTA, qk_scale, scale,
            stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
            stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
            stride_dqb, stride_dqh, stride_dqn,
            H, n_q, n_k,
            HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            PRECISION: tl.constexpr):
    """One program: dQ of one query block (BLOCK_M rows) of one (batch, head).

    Program p owns batch·head p // cdiv(n_q, BLOCK_M) and query block p % cdiv(n_q, BLOCK_M)
    (or, as the forward, counted from the last). LSE, DELTA as in _bwd_dkdv.
    """
    n_blocks = tl.cdiv(n_q, BLOCK_M)
    batch_heads = tl.num_programs(0) // n_blocks
    bh = tl.program_id(0) % batch_heads
    block = tl.program_id(0) // batch_heads
    b = bh // H
    h = bh % H
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    q = tiles.load_rows(tiles.row_ptrs(Q, b, h, stride_qb, stride_qh, stride_qn, rows, HEAD_DIM), rows, n_q, True)
    do = tiles.load_rows(tiles.row_ptrs(DO, b, h, stride_dob, stride_doh, stride_don, rows, HEAD_DIM), rows, n_q, True)
    lse2 = tl.load(LSE + bh.to(tl.int64) * n_q + rows, mask=rows < n_q, other=0.0) * 1.4426950408889634
    delta = tl.load(DELTA + bh.to(tl.int64) * n_q + rows, mask=rows < n_q, other=0.0)
    k_ptrs = tiles.row_ptrs(K, b, h, stride_kb, stride_kh, stride_kn, tl.arange(0, BLOCK_N), HEAD_DIM)
    v_ptrs = tiles.row_ptrs(V, b, h, stride_vb, stride_vh, stride_vn, tl.arange(0, BLOCK_N), HEAD_DIM)

    hi = n_k
    full = n_k
    if CAUSAL:  # keys below the block's first row are visible to all its rows
        hi = tl.minimum(n_k, (block + 1) * BLOCK_M)
        full = tl.minimum(n_k, block * BLOCK_M)
    full = full // BLOCK_N * BLOCK_N
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    dq = _dq_tiles(dq, q, do, lse2, delta, rows, k_ptrs, v_ptrs, stride_kn, stride_vn, 0, full, n_k,
                   qk_scale, False, CAUSAL, BLOCK_N, PRECISION)
    dq = _dq_tiles(dq, q, do, lse2, delta, rows, k_ptrs, v_ptrs, stride_kn, stride_vn, full, hi, n_k,
                   qk_scale, True, CAUSAL, BLOCK_N, PRECISION)
    dq_ptrs = tiles.row_ptrs(DQ, b, h, stride_dqb, stride_dqh, stride_dqn, rows, HEAD_DIM)
    tl.store(dq_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=(rows < n_q)[:, None])
