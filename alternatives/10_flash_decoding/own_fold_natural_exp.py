"""Alternative: the split kernel folds its chunk in loops of its own, not 06's attn_tiles, in
natural exp (tl.exp, m and lse in natural-log units) where attn_tiles works in base 2.

The stages are the solution's: whole tiles unmasked, the ragged end masked. The tests watch the
stages through attn_tiles, so here they report that rule not checked.
"""
import triton
import triton.language as tl


@triton.jit
def _split_kernel(Q, K, V, O_PART, LSE_PART, KV_LENS, qk_scale,
                  stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                  stride_vb, stride_vh, stride_vn,
                  H_kv, n_q, n_k, chunk, num_splits,
                  GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  PRECISION: tl.constexpr):
    """One program: one chunk of keys of one (batch, kv head), for one block of its group's rows."""
    n_rows = GROUP * n_q
    n_blocks = tl.cdiv(n_rows, BLOCK_M)
    pid = tl.program_id(0)
    split = pid % num_splits
    block = (pid // num_splits) % n_blocks
    bk = pid // (num_splits * n_blocks)
    b = bk // H_kv
    kv = bk % H_kv
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, HEAD_DIM)
    head = kv * GROUP + rows // n_q
    q_ptrs = (Q + b.to(tl.int64) * stride_qb + head[:, None].to(tl.int64) * stride_qh
              + (rows % n_q)[:, None] * stride_qn + cols[None, :])
    q = tl.load(q_ptrs, mask=(rows < n_rows)[:, None], other=0.0)
    if KV_LENS is None:
        n_keys = n_k
    else:
        n_keys = tl.load(KV_LENS + b)
    lo = split * chunk
    hi = tl.maximum(tl.minimum(lo + chunk, n_keys), lo)
    full = lo + (hi - lo) // BLOCK_N * BLOCK_N
    k_ptrs = tiles.row_ptrs(K, b, kv, stride_kb, stride_kh, stride_kn, tl.arange(0, BLOCK_N), HEAD_DIM)
    v_ptrs = tiles.row_ptrs(V, b, kv, stride_vb, stride_vh, stride_vn, tl.arange(0, BLOCK_N), HEAD_DIM)
    scale = qk_scale * 0.6931471805599453  # the wrapper's scale·log2(e), back to scale

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start in tl.range(lo, full, BLOCK_N):  # whole tiles: no bounds, no mask
        k = tl.load(k_ptrs + start * stride_kn)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        v = tl.load(v_ptrs + start * stride_vn)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m = m_new
    for start in tl.range(full, hi, BLOCK_N):  # the ragged end, at most one tile: keys past hi masked
        keys = start + tl.arange(0, BLOCK_N)
        k = tl.load(k_ptrs + start * stride_kn, mask=(keys < hi)[:, None], other=0.0)
        s = tl.where((keys < hi)[None, :], tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        v = tl.load(v_ptrs + start * stride_vn, mask=(keys < hi)[:, None], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m = m_new

    o = acc / tl.where(l == 0, 1.0, l)[:, None]
    lse = m + tl.log(l)  # natural log already; an empty chunk: -inf + log(0) = -inf
    out = (bk.to(tl.int64) * n_rows + rows) * num_splits + split
    tl.store(O_PART + out[:, None] * HEAD_DIM + cols[None, :], o, mask=(rows < n_rows)[:, None])
    tl.store(LSE_PART + out, lse, mask=rows < n_rows)
