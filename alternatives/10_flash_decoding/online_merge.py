"""Alternative: an online merge (running max, one split at a time, empty splits skipped); split-major grid."""
import triton
import triton.language as tl


@triton.jit
def _split_kernel(Q, K, V, O_PART, LSE_PART, KV_LENS, qk_scale,
                  stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                  stride_vb, stride_vh, stride_vn,
                  H_kv, n_q, n_k, chunk, num_splits,
                  GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  PRECISION: tl.constexpr):
    """One program: one chunk of keys of one (batch, kv head), for one block of its group's rows.

    Q (B, H_q, n_q, HEAD_DIM), K and V (B, H_kv, n_k, HEAD_DIM), last axis contiguous;
    O_PART (B·H_kv·GROUP·n_q, num_splits, HEAD_DIM) and LSE_PART (B·H_kv·GROUP·n_q, num_splits),
    float32, contiguous: row (b·H_kv + kv)·GROUP·n_q + r holds tile row r of kv head kv.
    KV_LENS (B,) int32 or None. chunk: keys per split, a multiple of BLOCK_N.
    """
    n_rows = GROUP * n_q
    n_blocks = tl.cdiv(n_rows, BLOCK_M)
    pid = tl.program_id(0)
    programs = tl.num_programs(0) // num_splits  # (batch·kv head, row block) pairs
    split = pid // programs
    block = pid % programs % n_blocks
    bk = pid % programs // n_blocks
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
    hi = tl.maximum(tl.minimum(lo + chunk, n_keys), lo)  # an empty chunk: hi = lo, no tile
    full = lo + (hi - lo) // BLOCK_N * BLOCK_N
    offs_n = tl.arange(0, BLOCK_N)
    k_ptrs = K + b.to(tl.int64) * stride_kb + kv.to(tl.int64) * stride_kh + offs_n[:, None] * stride_kn + cols[None, :]
    v_ptrs = V + b.to(tl.int64) * stride_vb + kv.to(tl.int64) * stride_vh + offs_n[:, None] * stride_vn + cols[None, :]

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    acc, l, m = attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, lo, full, hi, qk_scale, False, False,
                            BLOCK_N, PRECISION)
    acc, l, m = attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, full, hi, hi, qk_scale, True, False,
                            BLOCK_N, PRECISION)

    # An empty chunk has l = 0 and m = -inf: o = 0 / 1 = 0 and lse = -inf, the merge's identity.
    o = acc / tl.where(l == 0, 1.0, l)[:, None]
    lse = (m + tl.math.log2(l)) * 0.6931471805599453  # ln(2): base 2 back to natural log
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
    cols = tl.arange(0, HEAD_DIM)
    m = tl.full([], float("-inf"), tl.float32)
    l = tl.zeros([], tl.float32)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    for s in range(0, num_splits):
        lse_s = tl.load(LSE_PART + row * num_splits + s)
        if lse_s > float("-inf"):  # an empty split is the identity: skip it, never touch its o
            o_s = tl.load(O_PART + (row * num_splits + s) * HEAD_DIM + cols)
            m_new = tl.maximum(m, lse_s)
            alpha = tl.exp(m - m_new)
            w = tl.exp(lse_s - m_new)
            acc = acc * alpha + w * o_s
            l = l * alpha + w
            m = m_new
    o = acc / tl.where(l == 0, 1.0, l)
    tl.store(O + row * HEAD_DIM + cols, o.to(O.dtype.element_ty))
    tl.store(LSE + row, m + tl.log(l))
