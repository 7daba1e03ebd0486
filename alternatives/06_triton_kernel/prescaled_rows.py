"""Alternative: prescaled rows. The Q tile is multiplied by scale · log2(e) once, as it is loaded,
and attn_tiles folds its scores with a scale of 1.0; the scores differ from the solution's only by
the rounding of q's product in its own dtype.
"""
import triton
import triton.language as tl

from kata.given import tiles


@triton.jit
def _attn_fwd(Q, K, V, O, LSE, KV_LENS, qk_scale,
              stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
              H, n_q, n_k,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              PRECISION: tl.constexpr):
    """One program: one query block of one (batch, head), both taken from the 1-D program id.

    Q, O (B, H, n_q, HEAD_DIM); K, V (B, H, n_k, HEAD_DIM), last axis contiguous; LSE (B, H, n_q)
    contiguous float32; KV_LENS (B,) int32 or None. qk_scale = scale * log2(e). PRECISION: see attn_tiles.
    """
    n_blocks = tl.cdiv(n_q, BLOCK_M)
    bh = tl.program_id(0) // n_blocks
    # Under causal masking later blocks have more keys: launching them first evens out the tail.
    block = n_blocks - 1 - tl.program_id(0) % n_blocks
    b = bh // H
    h = bh % H
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    q = tiles.load_rows(tiles.row_ptrs(Q, b, h, stride_qb, stride_qh, stride_qn, rows, HEAD_DIM), rows, n_q, True)
    # Scaled once here, not each tile's scores: the rows of q carry scale · log2(e) from now on.
    q = (q * qk_scale).to(Q.dtype.element_ty)
    k_ptrs = tiles.row_ptrs(K, b, h, stride_kb, stride_kh, stride_kn, tl.arange(0, BLOCK_N), HEAD_DIM)
    v_ptrs = tiles.row_ptrs(V, b, h, stride_vb, stride_vh, stride_vn, tl.arange(0, BLOCK_N), HEAD_DIM)

    if KV_LENS is None:
        n_keys = n_k
    else:
        n_keys = tl.load(KV_LENS + b)
    hi = n_keys
    full = n_keys
    if CAUSAL:  # keys below the block's first row are visible to all its rows
        hi = tl.minimum(n_keys, (block + 1) * BLOCK_M)
        full = tl.minimum(n_keys, block * BLOCK_M)
    full = full // BLOCK_N * BLOCK_N  # stage 1 ends at the last whole tile

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    acc, l, m = attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, 0, full, n_keys,
                           1.0, False, CAUSAL, BLOCK_N, PRECISION)
    acc, l, m = attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, full, hi, n_keys,
                           1.0, True, CAUSAL, BLOCK_N, PRECISION)

    # A row with no key (kv_lens[b] = 0) has l = 0: dividing by 1 keeps o = 0; log2(0) = -inf = lse.
    o = acc / tl.where(l == 0, 1.0, l)[:, None]
    lse = (m + tl.math.log2(l)) * 0.6931471805599453  # ln(2): base 2 back to natural log
    o_ptrs = tiles.row_ptrs(O, b, h, stride_ob, stride_oh, stride_on, rows, HEAD_DIM)
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=(rows < n_q)[:, None])
    tl.store(LSE + bh.to(tl.int64) * n_q + rows, lse, mask=rows < n_q)
