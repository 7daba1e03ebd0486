"""Alternative: the walks in reverse, the masked stage first and each stage's tiles from the last to
the first; a row whose first tile visited holds no key it may attend keeps m = -inf, so the
exponentials shift by 0 there (exp2(-inf - (-inf)) would be NaN).

The stages are the solution's (only tiles the diagonal or the keys' end cuts run MASKED).
"""
import triton
import triton.language as tl


@triton.jit
def attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, lo, hi, n_keys, qk_scale,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Fold key tiles [lo, hi) into the running state of one query block, the last tile first."""
    offs_n = tl.arange(0, BLOCK_N)
    n_tiles = tl.cdiv(hi - lo, BLOCK_N)
    for t in tl.range(0, n_tiles):
        start = lo + (n_tiles - 1 - t) * BLOCK_N
        keys = start + offs_n
        k = tiles.load_rows(k_ptrs + start * stride_kn, keys, n_keys, MASKED)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if MASKED:
            keep = (keys < n_keys)[None, :]
            if CAUSAL:
                keep = keep & (keys[None, :] <= rows[:, None])
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1) * qk_scale)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key seen yet: every term stays 0
        p = tl.math.exp2(s * qk_scale - shift[:, None])
        alpha = tl.math.exp2(m - shift)
        l = l * alpha + tl.sum(p, 1)
        v = tiles.load_rows(v_ptrs + start * stride_vn, keys, n_keys, MASKED)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m = m_new
    return acc, l, m


@triton.jit
def _attn_fwd(Q, K, V, O, LSE, KV_LENS, qk_scale,
              stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
              H, n_q, n_k,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              PRECISION: tl.constexpr):
    """One program: one query block of one (batch, head); the masked stage, then the unmasked one."""
    n_blocks = tl.cdiv(n_q, BLOCK_M)
    bh = tl.program_id(0) // n_blocks
    block = n_blocks - 1 - tl.program_id(0) % n_blocks
    b = bh // H
    h = bh % H
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    q = tiles.load_rows(tiles.row_ptrs(Q, b, h, stride_qb, stride_qh, stride_qn, rows, HEAD_DIM), rows, n_q, True)
    k_ptrs = tiles.row_ptrs(K, b, h, stride_kb, stride_kh, stride_kn, tl.arange(0, BLOCK_N), HEAD_DIM)
    v_ptrs = tiles.row_ptrs(V, b, h, stride_vb, stride_vh, stride_vn, tl.arange(0, BLOCK_N), HEAD_DIM)
    if KV_LENS is None:
        n_keys = n_k
    else:
        n_keys = tl.load(KV_LENS + b)
    hi = n_keys
    full = n_keys
    if CAUSAL:
        hi = tl.minimum(n_keys, (block + 1) * BLOCK_M)
        full = tl.minimum(n_keys, block * BLOCK_M)
    full = full // BLOCK_N * BLOCK_N

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    acc, l, m = attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, full, hi, n_keys,
                           qk_scale, True, CAUSAL, BLOCK_N, PRECISION)
    acc, l, m = attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, 0, full, n_keys,
                           qk_scale, False, CAUSAL, BLOCK_N, PRECISION)

    o = acc / tl.where(l == 0, 1.0, l)[:, None]
    lse = (m + tl.math.log2(l)) * 0.6931471805599453
    o_ptrs = tiles.row_ptrs(O, b, h, stride_ob, stride_oh, stride_on, rows, HEAD_DIM)
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=(rows < n_q)[:, None])
    tl.store(LSE + bh.to(tl.int64) * n_q + rows, lse, mask=rows < n_q)
