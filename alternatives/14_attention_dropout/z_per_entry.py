"""Alternative: the forward multiplies each kept weight by 1/(1 − p), the paper's Z, where the solution
divides o by 1 − p once; the 1/(1 − p) comes in as an argument of the tiles."""
import triton
import triton.language as tl

from kata.given import tiles


@triton.jit
def _fwd_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, lo, hi, n_q, n_k, qk_scale,
               seed, dropout_p, bh, MASKED: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
               BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Fold key tiles [lo, hi) into the running state of one query block; acc sums (P̃ ∘ Z) V."""
    offs_n = tl.arange(0, BLOCK_N)
    kept_weight = 1.0 / (1.0 - dropout_p)
    for start in tl.range(lo, hi, BLOCK_N):
        keys = start + offs_n
        k = tiles.load_rows(k_ptrs + start * stride_kn, keys, n_k, MASKED)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if MASKED:
            keep = (keys < n_k)[None, :]
            if CAUSAL:
                keep = keep & (keys[None, :] <= rows[:, None])
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        if DROPOUT:
            z = tl.where(keep_mask(seed, dropout_p, bh, rows[:, None], keys[None, :], n_q, n_k), kept_weight, 0.0)
            p = p * z
        v = tiles.load_rows(v_ptrs + start * stride_vn, keys, n_k, MASKED)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m = m_new
    return acc, l, m


@triton.jit(do_not_specialize=["seed"])
def _attn_fwd(Q, K, V, O, LSE, seed, dropout_p, qk_scale,
              stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
              H, n_q, n_k,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: one query block of one (batch, head); Z is in acc already, so o = acc / l."""
    n_blocks = tl.cdiv(n_q, BLOCK_M)
    bh = tl.program_id(0) // n_blocks
    block = n_blocks - 1 - tl.program_id(0) % n_blocks
    b = bh // H
    h = bh % H
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    q = tiles.load_rows(tiles.row_ptrs(Q, b, h, stride_qb, stride_qh, stride_qn, rows, HEAD_DIM), rows, n_q, True)
    k_ptrs = tiles.row_ptrs(K, b, h, stride_kb, stride_kh, stride_kn, tl.arange(0, BLOCK_N), HEAD_DIM)
    v_ptrs = tiles.row_ptrs(V, b, h, stride_vb, stride_vh, stride_vn, tl.arange(0, BLOCK_N), HEAD_DIM)

    hi = n_k
    full = n_k
    if CAUSAL:
        hi = tl.minimum(n_k, (block + 1) * BLOCK_M)
        full = tl.minimum(n_k, block * BLOCK_M)
    full = full // BLOCK_N * BLOCK_N

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    acc, l, m = _fwd_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, 0, full, n_q, n_k, qk_scale,
                           seed, dropout_p, bh, False, CAUSAL, DROPOUT, BLOCK_N, PRECISION)
    acc, l, m = _fwd_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, full, hi, n_q, n_k, qk_scale,
                           seed, dropout_p, bh, True, CAUSAL, DROPOUT, BLOCK_N, PRECISION)

    o = acc / l[:, None]
    lse = (m + tl.math.log2(l)) * 0.6931471805599453
    o_ptrs = tiles.row_ptrs(O, b, h, stride_ob, stride_oh, stride_on, rows, HEAD_DIM)
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=(rows < n_q)[:, None])
    tl.store(LSE + bh.to(tl.int64) * n_q + rows, lse, mask=rows < n_q)
