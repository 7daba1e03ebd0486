"""Exercise 06 — the fused kernel in Triton.

The idea
    Exercises 02-05 built FlashAttention from NumPy pieces: a running max m and running sum l per
    query row, key tiles streamed past a block of queries, one normalisation at the end. Here the
    same algorithm becomes one GPU kernel. Each Triton *program* owns one block of BLOCK_M query rows
    of one (batch, head): it loads its Q tile once, streams the K and V tiles past it, and writes its
    O rows and lse once. The scores S and weights P live in registers and never reach HBM.

The formula (one program; scores kept in base 2, because exp2 is a single GPU instruction)
    s   = q @ k_j^T                           raw scores of key tile j
    m'  = max(m, rowmax(s) * c)               c = scale * log2(e), folded into one multiply-add
    p   = exp2(s * c - m')
    l   = l * exp2(m - m') + rowsum(p)        what was summed under the old max is rescaled
    acc = acc * exp2(m - m') + p @ v_j
    o   = acc / l      lse = (m + log2(l)) * ln(2)        (lse in natural log, as everywhere)

In the paper
    FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning (Dao, 2023,
    arXiv 2307.08691), Algorithm 1: the outer loop over query blocks is the launch grid,
    the inner loop over key blocks is the program's loop, and o is divided by l once, at the end.
    Its line 10 prints acc's factor as diag(e^(m_old - m_new))^-1, an inverse too many (a typo,
    also in its online-softmax derivation and in FlashAttention-3's Algorithm 1): multiply, as
    above; taken as printed, the first tile divides by e^(-inf) = 0 and gives NaN.

Where masks are paid (two stages, as in Triton's fused-attention tutorial)
    Stage 1 walks the key tiles every row of the block may attend: no mask, no bounds checks.
    Stage 2 walks the rest: the diagonal tiles under causal=True (query i sees key j iff j <= i,
    top-left aligned, as torch's is_causal=True; the flash-attn library and torch's
    causal_lower_right align bottom-right instead when n_q != n_k) and the ragged last tile, where keys at or past n_keys are masked to -inf
    and never loaded. n_keys is n_k, or kv_lens[b] when given.
    Example, n_q = n_k = 5, BLOCK_M = 4, BLOCK_N = 2, causal: rows 0-3 have no stage 1 and a
    masked stage 2 over keys [0, 4); row 4 has stage 1 over keys [0, 4) and stage 2 over key 4.

Conventions
    - q (B, H, n_q, D), k and v (B, H, n_k, D): float16, bfloat16 or float32, one device; D <= 256.
      o has q's dtype and shape; lse is float32 (B, H, n_q). m, l and acc are float32.
    - scale defaults to 1/sqrt(D) and must be positive. A fully masked row (kv_lens[b] = 0) has
      l = 0: o = 0 and lse = -inf, never NaN.
    - The wrapper zero-pads D to a power of two (tl.arange and every block shape need one), at
      least 16 (tl.dot's inner dimension, for float16 and bfloat16): zero columns change no score.
    - float32 multiplies in full float32 on a GPU, as torch's matmuls do, unless the user asked torch
      for TF32 (Triton's default): every tl.dot takes input_precision=PRECISION, which the wrapper
      sets from torch's setting (kata/given/precision.py).
    - Without a CUDA GPU the tests run the same kernel in Triton's interpreter (they set
      TRITON_INTERPRET=1 themselves) on the CPU, one program at a time, in
      float32 and float16 with small tiles (32 x 16); the tests also compile it for Ampere and Hopper
      in float16, bfloat16 and float32, where a module global read inside @triton.jit or tl.dot of mixed
      dtypes is refused. Only the GPU stage runs bfloat16, the tuned tiles and thousands of tokens.

Given (kata/given/, read it: it is part of the lesson)
    tiles.py    row_ptrs and load_rows, which point at and load a tile of rows (your kernels call
                them as tiles.row_ptrs, tiles.load_rows); the head-dim padding of the wrapper
    inputs.py   check_inputs: the wrapper's ValueErrors, raised before anything is launched
    launch.py   the grid (one program per query block and batch·head, all on axis 0), fixed tiles
                for small problems, autotuning over TUNING for large ones
    precision.py  dot_precision(dtype): tl.dot's input_precision, from torch's float32 matmul setting
"""
import math

import torch
import triton
import triton.language as tl

from kata.given import tiles
from kata.given.inputs import check_inputs
from kata.given.launch import LOG2E, autotuned, interpreted, launch
from kata.given.precision import dot_precision

TUNING = [  # on an H200 in bfloat16, 128 x 64 with 8 warps wins most cells; 64 x 64 wins causal N <= 2048
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=4, num_stages=3),  # two programs per SM at D <= 64
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3),  # two programs per SM at D = 128
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2),  # the smallest: D = 256 fits it
]


@triton.jit
def attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, lo, hi, n_keys, qk_scale,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Fold key tiles [lo, hi) into the running state of one query block.

    acc (BLOCK_M, HEAD_DIM), l and m (BLOCK_M,): float32 state, m in base-2 units.
    q (BLOCK_M, HEAD_DIM); k_ptrs, v_ptrs point at keys 0..BLOCK_N-1; rows: the block's query indices.
    MASKED: mask keys at or past n_keys, and (CAUSAL) keys after the query. PRECISION: tl.dot's
    input_precision ("ieee", or "tf32" where torch was asked for it). Returns acc, l, m.
    Exercise 10 folds its chunks of keys with this loop too (solved), with CAUSAL False.
    """
    # TODO: for each tile start in range(lo, hi, BLOCK_N): load K and V, score s = q @ k^T, apply the
    #       mask when MASKED, update m, l and acc as in the module docstring. Every tl.dot takes
    #       input_precision=PRECISION: float32 in full unless torch was asked for TF32.
    # BEGIN SOLUTION
    offs_n = tl.arange(0, BLOCK_N)
    for start in tl.range(lo, hi, BLOCK_N):
        keys = start + offs_n
        k = tiles.load_rows(k_ptrs + start * stride_kn, keys, n_keys, MASKED)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if MASKED:
            keep = (keys < n_keys)[None, :]
            if CAUSAL:
                keep = keep & (keys[None, :] <= rows[:, None])
            s = tl.where(keep, s, float("-inf"))
        # Every row sees key 0 in the first tile it visits, so m is finite from then on.
        m_new = tl.maximum(m, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m - m_new)  # the old terms were summed relative to the old max
        l = l * alpha + tl.sum(p, 1)
        v = tiles.load_rows(v_ptrs + start * stride_vn, keys, n_keys, MASKED)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m = m_new
    return acc, l, m
    # END SOLUTION


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
    # TODO: program p owns (batch·head) p // cdiv(n_q, BLOCK_M) and query block p % cdiv(n_q, BLOCK_M);
    #       load its Q tile once; run stage 1 (unmasked tiles) and stage 2 (masked tiles) through
    #       attn_tiles (passing PRECISION on); write o = acc / l and lse, with l = 0 giving o = 0, lse = -inf.
    # BEGIN SOLUTION
    n_blocks = tl.cdiv(n_q, BLOCK_M)
    bh = tl.program_id(0) // n_blocks
    # Under causal masking later blocks have more keys: launching them first evens out the tail.
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
    if CAUSAL:  # keys below the block's first row are visible to all its rows
        hi = tl.minimum(n_keys, (block + 1) * BLOCK_M)
        full = tl.minimum(n_keys, block * BLOCK_M)
    full = full // BLOCK_N * BLOCK_N  # stage 1 ends at the last whole tile

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    acc, l, m = attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, 0, full, n_keys,
                           qk_scale, False, CAUSAL, BLOCK_N, PRECISION)
    acc, l, m = attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, full, hi, n_keys,
                           qk_scale, True, CAUSAL, BLOCK_N, PRECISION)

    # A row with no key (kv_lens[b] = 0) has l = 0: dividing by 1 keeps o = 0; log2(0) = -inf = lse.
    o = acc / tl.where(l == 0, 1.0, l)[:, None]
    lse = (m + tl.math.log2(l)) * 0.6931471805599453  # ln(2): base 2 back to natural log
    o_ptrs = tiles.row_ptrs(O, b, h, stride_ob, stride_oh, stride_on, rows, HEAD_DIM)
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=(rows < n_q)[:, None])
    tl.store(LSE + bh.to(tl.int64) * n_q + rows, lse, mask=rows < n_q)
    # END SOLUTION


_attn_fwd_tuned = autotuned(_attn_fwd, TUNING)


def _fixed_config(width: int) -> dict:
    """Untuned tiles for small problems; the interpreter's 32 x 16 make even tiny tests span several tiles."""
    if interpreted():
        return dict(BLOCK_M=32, BLOCK_N=16)
    return dict(BLOCK_M=64, BLOCK_N=64 if width <= 128 else 32)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None, kv_lens: torch.Tensor | None = None):
    """softmax(scale * q k^T) v, fused. q (B, H, n_q, D), k and v (B, H, n_k, D); kv_lens (B,) or None.

    Returns o (B, H, n_q, D) in q's dtype and lse (B, H, n_q) float32, natural log.
    """
    check_inputs(q, k, v, scale, kv_lens)
    (B, H, n_q, D), n_k = q.shape, k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    width = tiles.padded_width(D)
    q, k, v = (tiles.pad_head_dim(t, width) for t in (q, k, v))
    o = torch.empty_like(q)
    lse = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    if kv_lens is not None:
        kv_lens = kv_lens.to(torch.int32)
    args = (q, k, v, o, lse, kv_lens, scale * LOG2E,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3], H, n_q, n_k)
    launch(_attn_fwd, _attn_fwd_tuned, args, rows=n_q, block="BLOCK_M", batch_heads=B * H,
           scores=B * H * n_q * n_k, fixed=_fixed_config(width), HEAD_DIM=width, CAUSAL=bool(causal),
           PRECISION=dot_precision(q.dtype))
    return o[..., :D], lse
