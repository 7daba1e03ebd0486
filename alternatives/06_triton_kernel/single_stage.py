"""Alternative: one masked loop stage over the visible keys, still stopping at the causal diagonal.

lse comes from m·ln(2) + ln(l); o is divided by max(l, 1e-30).
"""
import triton
import triton.language as tl


@triton.jit
def attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, lo, hi, n_keys, qk_scale,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Fold key tiles [lo, hi) into the running state of one query block.

    acc (BLOCK_M, HEAD_DIM), l and m (BLOCK_M,): float32 state, m in base-2 units.
    q (BLOCK_M, HEAD_DIM); k_ptrs, v_ptrs point at keys 0..BLOCK_N-1; rows: the block's query indices.
    MASKED: mask keys at or past n_keys, and (CAUSAL) keys after the query. Returns acc, l, m.
    """
    for start in tl.range(lo, hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        s = tl.dot(q, tl.trans(tiles.load_rows(k_ptrs + start * stride_kn, keys, n_keys, MASKED)), input_precision=PRECISION) * qk_scale
        if MASKED:
            allowed = (keys < n_keys)[None, :]
            if CAUSAL:
                allowed = allowed & (rows[:, None] >= keys[None, :])
            s = tl.where(allowed, s, float("-inf"))
        m_tile = tl.max(s, 1)
        m_new = tl.where(m_tile > m, m_tile, m)
        alpha = tl.math.exp2(m - m_new)  # rescales what l and acc summed under the old max
        p = tl.math.exp2(s - m_new[:, None])
        v = tiles.load_rows(v_ptrs + start * stride_vn, keys, n_keys, MASKED)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        l = l * alpha + tl.sum(p, 1)
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
    contiguous float32; KV_LENS (B,) int32 or None. qk_scale = scale * log2(e).
    """
    n_blocks = tl.cdiv(n_q, BLOCK_M)
    bh = tl.program_id(0) // n_blocks
    block = n_blocks - 1 - tl.program_id(0) % n_blocks
    b = bh // H
    h = bh - b * H
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    q = tiles.load_rows(tiles.row_ptrs(Q, b, h, stride_qb, stride_qh, stride_qn, rows, HEAD_DIM), rows, n_q, True)
    k_ptrs = tiles.row_ptrs(K, b, h, stride_kb, stride_kh, stride_kn, tl.arange(0, BLOCK_N), HEAD_DIM)
    v_ptrs = tiles.row_ptrs(V, b, h, stride_vb, stride_vh, stride_vn, tl.arange(0, BLOCK_N), HEAD_DIM)

    n_keys = n_k
    if KV_LENS is not None:
        n_keys = tl.load(KV_LENS + b)
    visible_end = n_keys
    if CAUSAL:  # no key past the block's last row is visible: those tiles are never loaded
        visible_end = tl.minimum(n_keys, (block + 1) * BLOCK_M)

    # One stage, every tile masked: simpler, at the cost of the mask on tiles that need none.
    acc, l, m = attn_tiles(tl.zeros([BLOCK_M, HEAD_DIM], tl.float32), tl.zeros([BLOCK_M], tl.float32),
                            tl.full([BLOCK_M], float("-inf"), tl.float32), q, k_ptrs, v_ptrs, stride_kn, stride_vn,
                            rows, 0, visible_end, n_keys, qk_scale, True, CAUSAL, BLOCK_N, PRECISION)

    # l = 0 only for a batch with kv_lens[b] = 0: acc is 0 there, so divide by 1; log2(0) = -inf.
    o = acc / tl.maximum(l, 1e-30)[:, None]
    lse = m * 0.6931471805599453 + tl.log(l)  # m is base 2: m·ln(2) + ln(l) = (m + log2(l))·ln(2)
    in_bounds = rows < n_q
    tl.store(tiles.row_ptrs(O, b, h, stride_ob, stride_oh, stride_on, rows, HEAD_DIM), o.to(O.dtype.element_ty),
             mask=in_bounds[:, None])
    tl.store(LSE + bh.to(tl.int64) * n_q + rows, lse, mask=in_bounds)
