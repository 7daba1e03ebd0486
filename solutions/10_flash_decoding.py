"""Exercise 10 — split-KV decoding (Flash-Decoding) in Triton.

The idea
    Generating text adds one token at a time: n_q = 1 new query row per head (a few more when
    speculating) attends a KV cache of n_k keys. Per cached key the kernel reads 2·D values of K and
    V and does 4·D·G FLOPs (G query heads share it): in bfloat16, D = 128, G = 4, that is
    512 bytes for 2048 FLOPs, 4 FLOPs a byte, where an H200 needs ~200 to keep its tensor cores
    busy. Decoding is memory-bound: the only number that matters is how close the kernel comes
    to the GPU's memory bandwidth.
    Exercise 06's grid has one program per (query block, batch·head): at n_q = 1 and B = 1 that is
    H programs, 32 on a GPU of 132 SMs, each streaming its whole head's keys alone. Most SMs sit
    idle, and bandwidth is only reached with every SM pulling data. Flash-Decoding (Dao, Haziza,
    Massa, Sizov, 2023, "Flash-Decoding for long-context inference", blog post) splits the keys:
    num_splits contiguous chunks per head, one program each, each writing a partial (o, lse);
    a second kernel merges the partials with exercise 03's rule.
    Grouped-query attention (Ainslie et al., 2023, arXiv 2305.13245, "GQA") stores H_kv < H_q
    key/value heads: query head h reads kv head h // G, G = H_q / H_kv. One program serves the
    whole group: its tile stacks the n_q rows of all G heads, so each K and V tile is read once.

Kernel 1, one program per (batch b, kv head, row block, split s): keys [s·chunk, (s+1)·chunk)
    cut at n_keys = kv_lens[b] (or n_k), tile row r = g·n_q + i is query row i of head kv·G + g:
    s   = q @ k_j^T,   m' = max(m, rowmax(s)·c),   p = exp2(s·c − m'),      c = scale·log2(e)
    l   = l·exp2(m − m') + rowsum(p),   acc = acc·exp2(m − m') + p @ v_j     (06's attn_tiles)
    o_s = acc / l,   lse_s = (m + log2 l)·ln 2          an empty chunk: o_s = 0, lse_s = −inf
Kernel 2, one program per output row: exercise 03's merge over all S splits at once
    lse = M + log Σ_s exp(lse_s − M),   M = max_s lse_s
    o   = Σ_s exp(lse_s − lse) · o_s          a split with lse_s = −inf adds exactly nothing

In the paper
    FlashAttention-2 (Dao, 2023, arXiv 2307.08691), section 3.2, parallelises over the sequence
    length as well as batch and heads; at n_q = 1 that leaves one query block per head, so
    Flash-Decoding parallelises over the keys instead and pays one small reduction at the end.

Conventions
    - q (B, H_q, n_q, D) with 1 <= n_q <= 16; k, v (B, H_kv, n_k, D), H_q a multiple of H_kv;
      float16, bfloat16 or float32, one device; D <= 256. Query rows are not causal among
      themselves: every row sees keys [0, kv_lens[b]). kv_lens (B,) int, as in 06.
    - o has q's dtype and shape, lse is float32 (B, H_q, n_q), natural log. Partials are float32.
    - kv_lens[b] = 0 makes every row of batch b fully masked: o = 0, lse = −inf, never NaN.
    - num_splits None: chosen from B·H_kv, n_k and the GPU's SM count (choose_num_splits).
      Chunks are keys_per_split(n_k, num_splits) long, whole tiles; splits past the end are empty.
    - Without a CUDA GPU the tests run the same kernels in Triton's interpreter (they set
      TRITON_INTERPRET=1 themselves) on the CPU, one program at a time, in
      float32 and float16 with 16-key tiles; the tests also compile them for Ampere and Hopper in
      float16, bfloat16 and float32, as a GPU would. Only the GPU stage runs bfloat16, the real tile sizes
      and split counts, and long caches.

Given (kata/given/)
    solved.py   solved("06").attn_tiles, exercise 06's loop over key tiles, solved: kernel 1 calls
                it as attn_tiles, with CAUSAL False and its PRECISION (06: tl.dot's input_precision)
    tiles.py    tiles.row_ptrs and tiles.load_rows, as in 06; the head-dim padding
    inputs.py   check_inputs: 06's ValueErrors, with grouped heads (the n_q and num_splits checks
                are decoding's own, in decode_partials)
    launch.py   interpreted(), and the constants LOG2E and MAX_TILE that 06 and 09 use too

Worked example (one query, G = 1, scores [0, log 3] over values [[1], [5]], 2 splits of 1 key)
    split 0: o_0 = [1], lse_0 = 0;   split 1: o_1 = [5], lse_1 = log 3
    M = log 3, lse = log 3 + log(1/3 + 1) = log 4,   o = (1/4)[1] + (3/4)[5] = [4]
GQA example: H_q = 8, H_kv = 2, n_q = 2: kv head 1 serves query heads 4-7; its tile's 8 rows are
    (head 4, row 0), (head 4, row 1), (head 5, row 0), ... (head 7, row 1).
"""
import math

import torch
import triton
import triton.language as tl

from kata.given import tiles
from kata.given.inputs import check_inputs
from kata.given.launch import LOG2E, MAX_TILE, interpreted
from kata.given.precision import dot_precision
from kata.given.solved import solved

attn_tiles = solved("06").attn_tiles  # exercise 06's inner loop, solved: fold key tiles into (acc, l, m)

MAX_QUERIES = 16  # decoding, or a few speculated tokens: more rows belong to exercise 06's kernel
PROGRAMS_PER_SM = 2  # on an H200, fewer longer splits beat 4 per SM at B = 1 (81% vs 72% of copy bandwidth)
MIN_SPLIT_TILES = 4  # shorter chunks spend more on the prologue and the partial's store than on keys
INTERPRETER_SMS = 4  # what choose_num_splits assumes without a GPU


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
    KV_LENS (B,) int32 or None. chunk: keys per split, a multiple of BLOCK_N. PRECISION: tl.dot's
    input_precision, from the wrapper (float32 in full unless torch was asked for TF32).
    """
    # TODO: program p is split p % num_splits, row block (p // num_splits) % cdiv(GROUP·n_q, BLOCK_M),
    #       (batch·kv head) the rest. Load the Q rows of the tile (row r: head kv·GROUP + r // n_q,
    #       query r % n_q); fold the chunk's whole tiles unmasked, then its ragged end masked, with
    #       attn_tiles (CAUSAL False, PRECISION passed on); store o = acc / l and lse, an empty chunk
    #       as (0, -inf).
    # BEGIN SOLUTION
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
    hi = tl.maximum(tl.minimum(lo + chunk, n_keys), lo)  # an empty chunk: hi = lo, no tile
    full = lo + (hi - lo) // BLOCK_N * BLOCK_N
    k_ptrs = tiles.row_ptrs(K, b, kv, stride_kb, stride_kh, stride_kn, tl.arange(0, BLOCK_N), HEAD_DIM)
    v_ptrs = tiles.row_ptrs(V, b, kv, stride_vb, stride_vh, stride_vn, tl.arange(0, BLOCK_N), HEAD_DIM)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # Not causal, so rows go unused; every tile holds a key below hi, so m is finite after the first.
    acc, l, m = attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, lo, full, hi, qk_scale,
                           False, False, BLOCK_N, PRECISION)
    acc, l, m = attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, full, hi, hi, qk_scale,
                           True, False, BLOCK_N, PRECISION)

    # An empty chunk has l = 0 and m = -inf: o = 0 / 1 = 0 and lse = -inf, the merge's identity.
    o = acc / tl.where(l == 0, 1.0, l)[:, None]
    lse = (m + tl.math.log2(l)) * 0.6931471805599453  # ln(2): base 2 back to natural log
    out = (bk.to(tl.int64) * n_rows + rows) * num_splits + split
    tl.store(O_PART + out[:, None] * HEAD_DIM + cols[None, :], o, mask=(rows < n_rows)[:, None])
    tl.store(LSE_PART + out, lse, mask=rows < n_rows)
    # END SOLUTION


@triton.jit
def _merge_kernel(O_PART, LSE_PART, O, LSE, num_splits, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr):
    """One program: one output row, merging its num_splits partials BLOCK_S at a time.

    O_PART (rows, num_splits, HEAD_DIM) and LSE_PART (rows, num_splits) float32, contiguous;
    O (rows, HEAD_DIM) in the output dtype and LSE (rows,) float32, contiguous.
    """
    # TODO: pass 1 finds M = max over the splits' lse; pass 2 sums w = exp(lse_s - M) and w · o_s
    #       (a split with w = 0 adds nothing, whatever its o holds: its o may be NaN, and 0 · NaN
    #       is NaN, so choose with tl.where rather than multiply). Store o = sum / l and
    #       lse = M + log(l); with every split empty, o = 0 and lse = -inf, never NaN.
    # BEGIN SOLUTION
    row = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    cols = tl.arange(0, HEAD_DIM)
    m = tl.full([BLOCK_S], float("-inf"), tl.float32)
    for start in tl.range(0, num_splits, BLOCK_S):
        splits = start + offs_s
        lse_s = tl.load(LSE_PART + row * num_splits + splits, mask=splits < num_splits, other=float("-inf"))
        m = tl.maximum(m, lse_s)
    m_all = tl.max(m, 0)
    shift = tl.where(m_all == float("-inf"), 0.0, m_all)  # all splits empty: -inf - (-inf) would be NaN

    l = tl.zeros([BLOCK_S], tl.float32)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    for start in tl.range(0, num_splits, BLOCK_S):
        splits = start + offs_s
        lse_s = tl.load(LSE_PART + row * num_splits + splits, mask=splits < num_splits, other=float("-inf"))
        w = tl.exp(lse_s - shift)
        o_s = tl.load(O_PART + (row * num_splits + splits)[:, None] * HEAD_DIM + cols[None, :],
                      mask=(splits < num_splits)[:, None], other=0.0)
        acc += tl.sum(tl.where(w[:, None] == 0, 0.0, w[:, None] * o_s), 0)  # 0 · NaN would be NaN
        l += w
    l_all = tl.sum(l, 0)
    o = acc / tl.where(l_all == 0, 1.0, l_all)
    tl.store(O + row * HEAD_DIM + cols, o.to(O.dtype.element_ty))
    tl.store(LSE + row, shift + tl.log(l_all))
    # END SOLUTION


def block_n() -> int:
    """Keys per tile: 64 compiled (K and V tiles of 64 x 128 bf16 pipeline in shared memory);
    16 in the interpreter, so that small tests span many tiles and splits."""
    return 16 if interpreted() else 64


def _num_stages(block_m: int, width: int, element_size: int) -> int:
    """Pipelined K and V tiles that fit in shared memory (~227 KB a block on an H100 or H200)
    beside the Q tile: 3 in bf16 at D = 128, fewer for float32 or D = 256."""
    q_tile, kv_tiles = block_m * width * element_size, 2 * block_n() * width * element_size
    return next((stages for stages in (3, 2) if q_tile + stages * kv_tiles <= 200 * 1024), 1)


def keys_per_split(n_k: int, num_splits: int) -> int:
    """Keys in each chunk: n_k / num_splits rounded up to whole tiles (splits past n_k are empty)."""
    return triton.cdiv(triton.cdiv(n_k, num_splits), block_n()) * block_n()


def choose_num_splits(programs: int, n_k: int, sm_count: int, min_split_tiles: int = MIN_SPLIT_TILES) -> int:
    """Splits per (batch, kv head, row block): enough programs for PROGRAMS_PER_SM on every SM, no
    chunk under min_split_tiles tiles, no split left empty. `programs` is B · H_kv · row blocks."""
    wanted = triton.cdiv(PROGRAMS_PER_SM * sm_count, programs)
    most = max(1, n_k // (min_split_tiles * block_n()))
    return triton.cdiv(n_k, keys_per_split(n_k, min(wanted, most)))


def _default_num_splits(programs: int, n_k: int, device: torch.device) -> int:
    """The GPU's SM count; the interpreter pretends to have INTERPRETER_SMS and takes one-tile chunks,
    so that small tests split too."""
    if interpreted():
        return choose_num_splits(programs, n_k, INTERPRETER_SMS, min_split_tiles=1)
    return choose_num_splits(programs, n_k, torch.cuda.get_device_properties(device).multi_processor_count)


def _block_m(n_rows: int, width: int) -> int:
    """Rows per tile: the group's G · n_q rows, a power of two (tl.arange's need) >= 16 (Triton pads
    a tl.dot of fewer rows to the tensor cores' 16 anyway), at most MAX_TILE / width (the
    interpreter's 512 / width, so that tests cut groups in row blocks)."""
    cap = (512 if interpreted() else MAX_TILE) // width
    return max(16, min(triton.next_power_of_2(n_rows), cap))


def decode_partials(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_lens: torch.Tensor | None = None,
                    num_splits: int | None = None, scale: float | None = None):
    """Kernel 1: each split's attention over its chunk of keys.

    Returns o_part (B, H_q, n_q, S, D) and lse_part (B, H_q, n_q, S), float32; S = num_splits, or
    choose_num_splits's answer when None. Split s covers keys [s·c, (s+1)·c) below kv_lens[b],
    c = keys_per_split(n_k, S).
    """
    check_inputs(q, k, v, scale, kv_lens, grouped_heads=True)
    if q.shape[2] > MAX_QUERIES:
        raise ValueError(f"n_q = {q.shape[2]} query rows: decoding takes 1 to {MAX_QUERIES} (use exercise 06 for more)")
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be an int >= 1 or None, got {num_splits!r}")
    (B, H_q, n_q, D), (H_kv, n_k) = q.shape, k.shape[1:3]
    group = H_q // H_kv
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    width = tiles.padded_width(D)
    q, k, v = (tiles.pad_head_dim(t, width) for t in (q, k, v))
    BLOCK_M, BLOCK_N = _block_m(group * n_q, width), block_n()
    row_blocks = triton.cdiv(group * n_q, BLOCK_M)
    if num_splits is None:
        num_splits = _default_num_splits(B * H_kv * row_blocks, n_k, q.device)
    o_part = torch.empty((B, H_q, n_q, num_splits, width), dtype=torch.float32, device=q.device)
    lse_part = torch.empty((B, H_q, n_q, num_splits), dtype=torch.float32, device=q.device)
    if kv_lens is not None:
        kv_lens = kv_lens.to(torch.int32)
    # One grid axis: CUDA's second and third stop at 65535 programs, which B·H_kv·splits can pass.
    grid = (B * H_kv * row_blocks * num_splits,)
    _split_kernel[grid](q, k, v, o_part, lse_part, kv_lens, scale * LOG2E,  # exp(x) = exp2(x log2 e)
                        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                        H_kv, n_q, n_k, keys_per_split(n_k, num_splits), num_splits,
                        GROUP=group, HEAD_DIM=width, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, PRECISION=dot_precision(q.dtype),
                        num_warps=4, num_stages=_num_stages(BLOCK_M, width, q.element_size()))
    return o_part[..., :D], lse_part


def merge_splits(o_part: torch.Tensor, lse_part: torch.Tensor, dtype: torch.dtype = torch.float32):
    """Kernel 2: exercise 03's merge of o_part (B, H, n_q, S, D), lse_part (B, H, n_q, S), float32.

    Returns o (B, H, n_q, D) in `dtype` and lse (B, H, n_q) float32.
    """
    if (not isinstance(o_part, torch.Tensor) or not isinstance(lse_part, torch.Tensor) or o_part.ndim != 5
            or tuple(lse_part.shape) != tuple(o_part.shape[:4])
            or o_part.dtype != torch.float32 or lse_part.dtype != torch.float32):
        raise ValueError(f"need float32 o_part (B, H, n_q, S, D) and lse_part (B, H, n_q, S), got "
                         f"{getattr(o_part, 'dtype', type(o_part))} {tuple(getattr(o_part, 'shape', ()))} and "
                         f"{getattr(lse_part, 'dtype', type(lse_part))} {tuple(getattr(lse_part, 'shape', ()))}")
    *lead, num_splits, D = o_part.shape
    width = tiles.padded_width(D)
    o_part = tiles.pad_head_dim(o_part, width).contiguous()
    o = torch.empty((*lead, width), dtype=dtype, device=o_part.device)
    lse = torch.empty(lead, dtype=torch.float32, device=o_part.device)
    _merge_kernel[(math.prod(lead),)](o_part, lse_part.contiguous(), o, lse, num_splits, HEAD_DIM=width,
                                      BLOCK_S=min(32, triton.next_power_of_2(num_splits)), num_warps=4)
    return o[..., :D], lse


def flash_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_lens: torch.Tensor | None = None,
                 num_splits: int | None = None, scale: float | None = None):
    """Attention of a few new query rows over a KV cache, split along the keys, then merged.

    q (B, H_q, n_q, D), k and v (B, H_kv, n_k, D); kv_lens (B,) or None.
    Returns o (B, H_q, n_q, D) in q's dtype and lse (B, H_q, n_q) float32, natural log.
    """
    o_part, lse_part = decode_partials(q, k, v, kv_lens, num_splits, scale)
    return merge_splits(o_part, lse_part, q.dtype)
