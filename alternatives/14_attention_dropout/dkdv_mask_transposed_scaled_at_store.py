"""Alternative: the dK, dV kernel draws its tile's mask with queries on the rows, as the forward does,
and transposes it (tl.trans); dV sums (Pᵀ ∘ keepᵀ) dO and is multiplied by 1/(1 − p) once, at its store."""
import triton
import triton.language as tl

from kata.given import tiles


@triton.jit
def _dkdv_tiles(dk, dv, k, v, keys, q_ptrs, do_ptrs, stride_qn, stride_don, LSE, DELTA, lo, hi, n_q, n_k,
                qk_scale, seed, dropout_p, bh, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                DROPOUT: tl.constexpr, BLOCK_M: tl.constexpr, PRECISION: tl.constexpr):
    """Add query tiles [lo, hi) into dk, dv of one key block; dv not yet times 1/(1 − p), dk not yet times scale."""
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
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale
                           - lse[None, :] * 1.4426950408889634)
        if MASKED:
            if CAUSAL:
                p_t = tl.where(keys[:, None] <= rows[None, :], p_t, 0.0)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        if DROPOUT:
            keep_t = tl.trans(keep_mask(seed, dropout_p, bh, rows[:, None], keys[None, :], n_q, n_k))
            dv = tl.dot(tl.where(keep_t, p_t, 0.0).to(do.dtype), do, dv, input_precision=PRECISION)
            dp_t = tl.where(keep_t, dp_t / (1.0 - dropout_p), 0.0)
        else:
            dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=PRECISION)
    return dk, dv


@triton.jit(do_not_specialize=["seed"])
def _bwd_dkdv(Q, K, V, DO, DK, DV, LSE, DELTA, seed, dropout_p, qk_scale, scale,
              stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
              stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
              H, n_q, n_k,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: dK and dV of one key block of one (batch, head); dV times 1/(1 − p) at the store."""
    n_blocks = tl.cdiv(n_k, BLOCK_N)
    bh = tl.program_id(0) // n_blocks
    block = tl.program_id(0) % n_blocks
    b = bh // H
    h = bh % H
    keys = block * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tiles.load_rows(tiles.row_ptrs(K, b, h, stride_kb, stride_kh, stride_kn, keys, HEAD_DIM), keys, n_k, True)
    v = tiles.load_rows(tiles.row_ptrs(V, b, h, stride_vb, stride_vh, stride_vn, keys, HEAD_DIM), keys, n_k, True)
    q_ptrs = tiles.row_ptrs(Q, b, h, stride_qb, stride_qh, stride_qn, tl.arange(0, BLOCK_M), HEAD_DIM)
    do_ptrs = tiles.row_ptrs(DO, b, h, stride_dob, stride_doh, stride_don, tl.arange(0, BLOCK_M), HEAD_DIM)
    LSE += bh.to(tl.int64) * n_q
    DELTA += bh.to(tl.int64) * n_q

    full = n_q // BLOCK_M * BLOCK_M
    lo = 0
    diagonal = 0
    mid = 0
    tail = full
    if CAUSAL:
        lo = block * BLOCK_N // BLOCK_M * BLOCK_M
        mid = tl.cdiv((block + 1) * BLOCK_N, BLOCK_M) * BLOCK_M
        diagonal = tl.minimum(mid, n_q)
        tail = tl.maximum(mid, full)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dk, dv = _dkdv_tiles(dk, dv, k, v, keys, q_ptrs, do_ptrs, stride_qn, stride_don, LSE, DELTA, lo, diagonal,
                         n_q, n_k, qk_scale, seed, dropout_p, bh, True, CAUSAL, DROPOUT, BLOCK_M, PRECISION)
    dk, dv = _dkdv_tiles(dk, dv, k, v, keys, q_ptrs, do_ptrs, stride_qn, stride_don, LSE, DELTA, mid, full,
                         n_q, n_k, qk_scale, seed, dropout_p, bh, False, CAUSAL, DROPOUT, BLOCK_M, PRECISION)
    dk, dv = _dkdv_tiles(dk, dv, k, v, keys, q_ptrs, do_ptrs, stride_qn, stride_don, LSE, DELTA, tail, n_q,
                         n_q, n_k, qk_scale, seed, dropout_p, bh, True, CAUSAL, DROPOUT, BLOCK_M, PRECISION)
    if DROPOUT:
        dv = dv / (1.0 - dropout_p)

    dk_ptrs = tiles.row_ptrs(DK, b, h, stride_dkb, stride_dkh, stride_dkn, keys, HEAD_DIM)
    dv_ptrs = tiles.row_ptrs(DV, b, h, stride_dvb, stride_dvh, stride_dvn, keys, HEAD_DIM)
    tl.store(dk_ptrs, (dk * scale).to(DK.dtype.element_ty), mask=(keys < n_k)[:, None])
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=(keys < n_k)[:, None])
