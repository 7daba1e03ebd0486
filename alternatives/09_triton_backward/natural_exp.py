"""Alternative: natural exp (tl.exp) in both backward kernels, P = exp(scale·S − lse) with lse as saved.

The kernels undo the wrapper's log2(e) factor.
"""
import triton
import triton.language as tl


@triton.jit
def _dkdv_tiles(dk, dv, k, v, keys, q_ptrs, do_ptrs, stride_qn, stride_don, LSE, DELTA, lo, hi, n_q,
                qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, PRECISION: tl.constexpr):
    """Add query tiles [lo, hi) into the float32 sums dk, dv (BLOCK_N, HEAD_DIM) of one key block.

    k, v (BLOCK_N, HEAD_DIM) on chip; keys: their indices. q_ptrs, do_ptrs point at query rows
    0..BLOCK_M-1 of this (batch, head); LSE, DELTA at its first row. MASKED: rows at or past n_q
    load as 0, and (CAUSAL) Pᵀ is 0 where key > query. Returns dk, dv, not yet times scale.
    """
    # TODO: for each tile start in range(lo, hi, BLOCK_M): load Q, dO, lse and D of its rows;
    #       Sᵀ = k @ qᵀ, Pᵀ = exp2(Sᵀ·qk_scale − lse·log2 e) (masked when MASKED and CAUSAL);
    #       dv += Pᵀ @ dO; dPᵀ = v @ dOᵀ; dSᵀ = Pᵀ ∘ (dPᵀ − D); dk += dSᵀ @ q.
    offs_m = tl.arange(0, BLOCK_M)
    for start in tl.range(lo, hi, BLOCK_M):
        rows = start + offs_m
        q = tiles.load_rows(q_ptrs + start * stride_qn, rows, n_q, MASKED)
        do = tiles.load_rows(do_ptrs + start * stride_don, rows, n_q, MASKED)
        if MASKED:
            lse = tl.load(LSE + rows, mask=rows < n_q, other=0.0)
            delta = tl.load(DELTA + rows, mask=rows < n_q, other=0.0)
        else:
            lse = tl.load(LSE + rows)
            delta = tl.load(DELTA + rows)
        p_t = tl.exp(tl.dot(k, tl.trans(q), input_precision=PRECISION) * (qk_scale * 0.6931471805599453) - lse[None, :])
        if MASKED:
            if CAUSAL:
                p_t = tl.where(keys[:, None] <= rows[None, :], p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=PRECISION)
    return dk, dv


@triton.jit
def _dq_tiles(dq, q, do, lse2, delta, rows, k_ptrs, v_ptrs, stride_kn, stride_vn, lo, hi, n_k, qk_scale,
              MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Add key tiles [lo, hi) into the float32 sum dq (BLOCK_M, HEAD_DIM) of one query block.

    q, do (BLOCK_M, HEAD_DIM), lse2 = lse · log2(e) and delta (BLOCK_M,) on chip; rows: their
    indices. k_ptrs, v_ptrs point at keys 0..BLOCK_N-1. MASKED: keys at or past n_k load as 0,
    and (CAUSAL) P is 0 where key > query. Returns dq, not yet times scale.
    """
    # TODO: for each tile start in range(lo, hi, BLOCK_N): load K and V; S = q @ kᵀ,
    #       P = exp2(S·qk_scale − lse2) (masked when MASKED and CAUSAL); dP = do @ vᵀ;
    #       dS = P ∘ (dP − delta); dq += dS @ k.
    offs_n = tl.arange(0, BLOCK_N)
    for start in tl.range(lo, hi, BLOCK_N):
        keys = start + offs_n
        k = tiles.load_rows(k_ptrs + start * stride_kn, keys, n_k, MASKED)
        v = tiles.load_rows(v_ptrs + start * stride_vn, keys, n_k, MASKED)
        p = tl.exp(tl.dot(q, tl.trans(k), input_precision=PRECISION) * (qk_scale * 0.6931471805599453) - lse2[:, None])
        if MASKED:
            if CAUSAL:
                p = tl.where(keys[None, :] <= rows[:, None], p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
    return dq


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
    # TODO: load this block's Q, dO, lse and D once (rows past n_q masked); walk the key tiles as
    #       06's forward does (stage 1 unmasked up to `full`, stage 2 MASKED up to `hi`) with
    #       _dq_tiles; store dq·scale for rows < n_q.
    n_blocks = tl.cdiv(n_q, BLOCK_M)
    bh = tl.program_id(0) // n_blocks
    block = n_blocks - 1 - tl.program_id(0) % n_blocks  # causal: the heaviest blocks first
    b = bh // H
    h = bh % H
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    q = tiles.load_rows(tiles.row_ptrs(Q, b, h, stride_qb, stride_qh, stride_qn, rows, HEAD_DIM), rows, n_q, True)
    do = tiles.load_rows(tiles.row_ptrs(DO, b, h, stride_dob, stride_doh, stride_don, rows, HEAD_DIM), rows, n_q, True)
    lse2 = tl.load(LSE + bh.to(tl.int64) * n_q + rows, mask=rows < n_q, other=0.0)
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
