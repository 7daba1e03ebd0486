"""Alternative: the dK, dV kernel computes S, P, dP, dS query-major and transposes P and dS for tl.dot.

The sums are added with += rather than through tl.dot's accumulator.
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
        p = tl.math.exp2(tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale - lse[:, None] * 1.4426950408889634)
        if MASKED:
            if CAUSAL:
                p = tl.where(keys[None, :] <= rows[:, None], p, 0.0)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    return dk, dv
