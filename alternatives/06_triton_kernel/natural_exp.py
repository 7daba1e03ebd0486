"""Alternative: natural exp (tl.exp), scores and m in natural units, lse = m + log(l).

The kernel undoes the wrapper's log2(e) factor; the stage bounds are written out per case.
"""
import triton
import triton.language as tl


@triton.jit
def attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, lo, hi, n_keys, qk_scale,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Fold key tiles [lo, hi) into the running state of one query block.

    acc (BLOCK_M, HEAD_DIM), l and m (BLOCK_M,): float32 state, m in natural units.
    q (BLOCK_M, HEAD_DIM); k_ptrs, v_ptrs point at keys 0..BLOCK_N-1; rows: the block's query indices.
    MASKED: mask keys at or past n_keys, and (CAUSAL) keys after the query. Returns acc, l, m.
    """
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        keys = start + offs_n
        k = tiles.load_rows(k_ptrs + start * stride_kn, keys, n_keys, MASKED)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # natural units: qk_scale is the plain scale here
        if MASKED:
            visible = keys[None, :] < n_keys
            if CAUSAL:
                visible = visible & (keys[None, :] <= rows[:, None])
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))  # finite: every row sees key 0 in its first tile
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = alpha * l + tl.sum(p, 1)
        v = tiles.load_rows(v_ptrs + start * stride_vn, keys, n_keys, MASKED)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new
    return acc, l, m


@triton.jit
def _attn_fwd(Q, K, V, O, LSE, KV_LENS, qk_scale,
              stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
              H, n_q, n_k,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              PRECISION: tl.constexpr):
    """One program: one query block of one (batch, head), both taken from the 1-D program id.

    Q, O (B, H, n_q, HEAD_DIM); K, V (B, H, n_k, HEAD_DIM), last axis contiguous; LSE (B, H, n_q)
    contiguous float32; KV_LENS (B,) int32 or None. qk_scale = scale * log2(e), undone here.
    """
    n_blocks = tl.cdiv(n_q, BLOCK_M)
    pid = tl.program_id(0)
    bh = pid // n_blocks
    block = n_blocks - 1 - pid % n_blocks  # the longest causal blocks first
    b, h = bh // H, bh % H
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    q = tiles.load_rows(tiles.row_ptrs(Q, b, h, stride_qb, stride_qh, stride_qn, rows, HEAD_DIM), rows, n_q, True)
    k_ptrs = tiles.row_ptrs(K, b, h, stride_kb, stride_kh, stride_kn, tl.arange(0, BLOCK_N), HEAD_DIM)
    v_ptrs = tiles.row_ptrs(V, b, h, stride_vb, stride_vh, stride_vn, tl.arange(0, BLOCK_N), HEAD_DIM)
    sm_scale = qk_scale * 0.6931471805599453  # the wrapper folded log2(e) in; this kernel uses exp

    n_keys = n_k if KV_LENS is None else tl.load(KV_LENS + b)
    if CAUSAL:
        first_row = block * BLOCK_M
        # Tiles wholly left of the block's first row need no mask; none past its last row is visited.
        unmasked_end = tl.minimum(n_keys, first_row) // BLOCK_N * BLOCK_N
        end = tl.minimum(n_keys, first_row + BLOCK_M)
    else:
        unmasked_end = n_keys // BLOCK_N * BLOCK_N
        end = n_keys

    m = tl.zeros([BLOCK_M], tl.float32) - float("inf")
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    acc, l, m = attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, 0, unmasked_end, n_keys,
                            sm_scale, False, CAUSAL, BLOCK_N, PRECISION)
    acc, l, m = attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, unmasked_end, end, n_keys,
                            sm_scale, True, CAUSAL, BLOCK_N, PRECISION)

    no_key = l == 0.0  # kv_lens[b] = 0: o = 0 and lse = -inf
    o = tl.where(no_key[:, None], 0.0, acc / tl.where(no_key, 1.0, l)[:, None])
    lse = tl.where(no_key, float("-inf"), m + tl.log(l))  # natural log throughout: lse = m + log(l)
    tl.store(tiles.row_ptrs(O, b, h, stride_ob, stride_oh, stride_on, rows, HEAD_DIM), o.to(O.dtype.element_ty),
             mask=(rows < n_q)[:, None])
    tl.store(LSE + bh.to(tl.int64) * n_q + rows, lse, mask=rows < n_q)
