"""Alternative: natural exp in the split kernel (its own single masked loop), the merge in base 2."""
import triton
import triton.language as tl


@triton.jit
def _split_kernel(Q, K, V, O_PART, LSE_PART, KV_LENS, qk_scale,
                  stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                  stride_vb, stride_vh, stride_vn,
                  H_kv, n_q, n_k, chunk, num_splits,
                  GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: one chunk of keys of one (batch, kv head), for one block of its group's rows.

    Q (B, H_q, n_q, HEAD_DIM), K and V (B, H_kv, n_k, HEAD_DIM), last axis contiguous;
    O_PART (B·H_kv·GROUP·n_q, num_splits, HEAD_DIM) and LSE_PART (B·H_kv·GROUP·n_q, num_splits),
    float32, contiguous: row (b·H_kv + kv)·GROUP·n_q + r holds tile row r of kv head kv.
    KV_LENS (B,) int32 or None. chunk: keys per split, a multiple of BLOCK_N.
    """
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
    g = rows // n_q
    i = rows - g * n_q
    q = tl.load(Q + b.to(tl.int64) * stride_qb + (kv * GROUP + g)[:, None].to(tl.int64) * stride_qh
                + i[:, None] * stride_qn + cols[None, :], mask=(rows < n_rows)[:, None], other=0.0)
    scale = qk_scale / 1.4426950408889634  # back to natural units
    if KV_LENS is None:
        n_keys = n_k
    else:
        n_keys = tl.load(KV_LENS + b)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, n_keys)
    offs_n = tl.arange(0, BLOCK_N)
    k_base = K + b.to(tl.int64) * stride_kb + kv.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + kv.to(tl.int64) * stride_vh
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        keys = start + offs_n
        live = keys < hi
        k = tl.load(k_base + keys[:, None] * stride_kn + cols[None, :], mask=live[:, None], other=0.0)
        v = tl.load(v_base + keys[:, None] * stride_vn + cols[None, :], mask=live[:, None], other=0.0)
        s = tl.where(live[None, :], tl.dot(q, tl.trans(k)) * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    has_keys = l > 0
    o = tl.where(has_keys[:, None], acc / tl.where(has_keys, l, 1.0)[:, None], 0.0)
    lse = tl.where(has_keys, m + tl.log(tl.where(has_keys, l, 1.0)), float("-inf"))
    out = (bk.to(tl.int64) * n_rows + rows) * num_splits + split
    tl.store(O_PART + out[:, None] * HEAD_DIM + cols[None, :], o, mask=(rows < n_rows)[:, None])
    tl.store(LSE_PART + out, lse, mask=rows < n_rows)


@triton.jit
def _merge_kernel(O_PART, LSE_PART, O, LSE, num_splits, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr):
    """One program: one output row, merging its num_splits partials BLOCK_S at a time.

    O_PART (rows, num_splits, HEAD_DIM) and LSE_PART (rows, num_splits) float32, contiguous;
    O (rows, HEAD_DIM) in the output dtype and LSE (rows,) float32, contiguous.
    """
    row = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    cols = tl.arange(0, HEAD_DIM)
    m = tl.full([BLOCK_S], float("-inf"), tl.float32)
    for start in range(0, num_splits, BLOCK_S):
        splits = start + offs_s
        m = tl.maximum(m, tl.load(LSE_PART + row * num_splits + splits, mask=splits < num_splits,
                                  other=float("-inf")))
    top = tl.max(m, 0)
    top = tl.where(top > float("-inf"), top, 0.0)
    l = tl.zeros([BLOCK_S], tl.float32)
    acc = tl.zeros([BLOCK_S, HEAD_DIM], tl.float32)
    for start in range(0, num_splits, BLOCK_S):
        splits = start + offs_s
        live = splits < num_splits
        lse_s = tl.load(LSE_PART + row * num_splits + splits, mask=live, other=float("-inf"))
        w = tl.math.exp2((lse_s - top) * 1.4426950408889634)  # the difference first: lse may be large
        o_s = tl.load(O_PART + (row * num_splits + splits)[:, None] * HEAD_DIM + cols[None, :],
                      mask=(live & (w > 0))[:, None], other=0.0)  # an empty split's o is never loaded
        acc += w[:, None] * o_s
        l += w
    total = tl.sum(l, 0)
    o = tl.sum(acc, 0) / tl.maximum(total, 1e-30)
    tl.store(O + row * HEAD_DIM + cols, o.to(O.dtype.element_ty))
    tl.store(LSE + row, top + tl.math.log2(total) * 0.6931471805599453)
