"""Alternative: block-major 1-D grid (program p: block p // (B·H), batch·head p % (B·H)), no reversal.

The tile loop steps its K and V pointers and key indices instead of recomputing them.
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
    k_ptrs += lo * stride_kn
    v_ptrs += lo * stride_vn
    keys = lo + tl.arange(0, BLOCK_N)
    for _ in tl.range(lo, hi, BLOCK_N):
        k = tiles.load_rows(k_ptrs, keys, n_keys, MASKED)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        if MASKED:
            s = tl.where((keys < n_keys)[None, :], s, float("-inf"))
            if CAUSAL:
                s = tl.where(keys[None, :] > rows[:, None], float("-inf"), s)
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m - m_new)
        v = tiles.load_rows(v_ptrs, keys, n_keys, MASKED)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        l = tl.fma(l, alpha, tl.sum(p, 1))
        m = m_new
        # Step the pointers and key indices to the next tile instead of recomputing them.
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
        keys += BLOCK_N
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
    n_bh = tl.num_programs(0) // n_blocks  # B·H: the grid holds n_blocks programs per (batch, head)
    # Block-major: consecutive programs take the same query block of consecutive (batch, head)s.
    block = tl.program_id(0) // n_bh
    bh = tl.program_id(0) % n_bh
    b = bh // H
    h = bh % H
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    q = tiles.load_rows(tiles.row_ptrs(Q, b, h, stride_qb, stride_qh, stride_qn, rows, HEAD_DIM), rows, n_q, True)
    k_ptrs = tiles.row_ptrs(K, b, h, stride_kb, stride_kh, stride_kn, tl.arange(0, BLOCK_N), HEAD_DIM)
    v_ptrs = tiles.row_ptrs(V, b, h, stride_vb, stride_vh, stride_vn, tl.arange(0, BLOCK_N), HEAD_DIM)

    n_keys = n_k
    if KV_LENS is not None:
        n_keys = tl.load(KV_LENS + b)
    stage_2_end = n_keys
    stage_1_end = n_keys
    if CAUSAL:
        stage_2_end = tl.minimum(n_keys, block * BLOCK_M + BLOCK_M)
        stage_1_end = tl.minimum(n_keys, block * BLOCK_M)
    stage_1_end -= stage_1_end % BLOCK_N  # whole tiles only: the ragged one goes to stage 2

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    acc, l, m = attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, 0, stage_1_end, n_keys,
                            qk_scale, False, CAUSAL, BLOCK_N, PRECISION)
    acc, l, m = attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, stage_1_end, stage_2_end,
                            n_keys, qk_scale, True, CAUSAL, BLOCK_N, PRECISION)

    empty = l == 0  # kv_lens[b] = 0: no key at all
    o = acc / tl.where(empty, 1.0, l)[:, None]  # acc is 0 on an empty row: 0 / 1 = 0
    lse = tl.where(empty, float("-inf"), (m + tl.math.log2(l)) * 0.6931471805599453)
    keep = rows < n_q
    tl.store(tiles.row_ptrs(O, b, h, stride_ob, stride_oh, stride_on, rows, HEAD_DIM), o.to(O.dtype.element_ty),
             mask=keep[:, None])
    tl.store(LSE + bh.to(tl.int64) * n_q + rows, lse, mask=keep)
