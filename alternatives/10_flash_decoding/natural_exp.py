"""Alternative: natural exp in the split kernel (its own single masked loop), the merge in base 2."""
import math
import os

import torch
import triton
import triton.language as tl

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256
MAX_QUERIES = 16  # decoding, or a few speculated tokens: more rows belong to exercise 06's kernel
TILE_ELEMENTS = 128 * 128  # rows x width of a query tile: its float32 accumulator must fit in registers
PROGRAMS_PER_SM = 2  # on an H200, fewer longer splits beat 4 per SM at B = 1 (81% vs 72% of copy bandwidth)
MIN_SPLIT_TILES = 4  # shorter chunks spend more on the prologue and the partial's store than on keys
INTERPRETER_SMS = 4  # what choose_num_splits assumes without a GPU
LN2 = 0.6931471805599453
LOG2E = 1.4426950408889634


@triton.jit
def _fold_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, lo, hi, qk_scale,
                MASKED: tl.constexpr, BLOCK_N: tl.constexpr):
    """Fold key tiles starting at lo, lo + BLOCK_N, ... below hi into the running (acc, l, m).

    Exercise 06's loop without causality: when MASKED, keys at or past hi score -inf and are never
    loaded. Every tile holds at least one key below hi, so m is finite after the first.
    """
    offs_n = tl.arange(0, BLOCK_N)
    for start in tl.range(lo, hi, BLOCK_N):
        keys = start + offs_n
        if MASKED:
            k = tl.load(k_ptrs + start * stride_kn, mask=(keys < hi)[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs + start * stride_kn)
        s = tl.dot(q, tl.trans(k))
        if MASKED:
            s = tl.where((keys < hi)[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(v_ptrs + start * stride_vn, mask=(keys < hi)[:, None], other=0.0)
        else:
            v = tl.load(v_ptrs + start * stride_vn)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m = m_new
    return acc, l, m


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
                                  other=float("-inf")) * 1.4426950408889634)
    top = tl.max(m, 0)
    top = tl.where(top > float("-inf"), top, 0.0)
    l = tl.zeros([BLOCK_S], tl.float32)
    acc = tl.zeros([BLOCK_S, HEAD_DIM], tl.float32)
    for start in range(0, num_splits, BLOCK_S):
        splits = start + offs_s
        live = splits < num_splits
        lse2 = tl.load(LSE_PART + row * num_splits + splits, mask=live, other=float("-inf")) * 1.4426950408889634
        w = tl.math.exp2(lse2 - top)
        o_s = tl.load(O_PART + (row * num_splits + splits)[:, None] * HEAD_DIM + cols[None, :],
                      mask=(live & (w > 0))[:, None], other=0.0)  # an empty split's o is never loaded
        acc += w[:, None] * o_s
        l += w
    total = tl.sum(l, 0)
    o = tl.sum(acc, 0) / tl.maximum(total, 1e-30)
    tl.store(O + row * HEAD_DIM + cols, o.to(O.dtype.element_ty))
    tl.store(LSE + row, (top + tl.math.log2(total)) * 0.6931471805599453)


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _check_inputs(q, k, v, kv_lens, num_splits, scale) -> None:
    """Raise ValueError naming the first problem with the inputs; launch nothing."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.ndim != 4:
            raise ValueError(f"{name} must be a 4-D torch tensor (B, H, n, D), got {getattr(t, 'shape', type(t))}")
        if t.dtype not in DTYPES or t.dtype != q.dtype:
            raise ValueError(f"{name} is {t.dtype}: q, k and v must share one dtype of float16, bfloat16, float32")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}: q, k and v must share one device")
    if q.device.type != "cuda" and not _interpreted():
        raise ValueError(f"tensors are on {q.device}: compiled Triton needs CUDA (or set TRITON_INTERPRET=1)")
    if _interpreted() and q.dtype == torch.bfloat16:
        raise ValueError("dtype bfloat16 under TRITON_INTERPRET=1: Triton's interpreter multiplies the raw bits "
                         "of bfloat16 in tl.dot and returns garbage; use float32 (or float16) on the CPU")
    (B, H_q, n_q, D), (H_kv, n_k) = q.shape, k.shape[1:3]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: "
                         f"need q (B, H_q, n_q, D) and k, v both (B, H_kv, n_k, D)")
    if min(B, H_q, n_q, H_kv, n_k) < 1:
        raise ValueError(f"empty input: B, H_q, n_q, H_kv, n_k must be >= 1, got {B}, {H_q}, {n_q}, {H_kv}, {n_k}")
    if n_q > MAX_QUERIES:
        raise ValueError(f"n_q = {n_q} query rows: decoding takes 1 to {MAX_QUERIES} (use exercise 06 for more)")
    if H_q % H_kv:
        raise ValueError(f"H_q = {H_q} query heads is not a multiple of H_kv = {H_kv} kv heads: "
                         f"each kv head must serve H_q / H_kv query heads")
    if D > MAX_HEAD_DIM:
        raise ValueError(f"head dimension D = {D} is over the {MAX_HEAD_DIM} this kernel supports")
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale}")
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be an int >= 1 or None, got {num_splits!r}")
    if kv_lens is not None:
        if (not isinstance(kv_lens, torch.Tensor) or kv_lens.shape != (B,)
                or kv_lens.dtype not in (torch.int32, torch.int64)):
            raise ValueError(f"kv_lens must be an int32 or int64 tensor of shape ({B},), got "
                             f"{getattr(kv_lens, 'dtype', type(kv_lens))} {tuple(getattr(kv_lens, 'shape', ()))}")
        if kv_lens.device != q.device:
            raise ValueError(f"kv_lens is on {kv_lens.device}, q on {q.device}: they must share one device")
        if kv_lens.min() < 0 or kv_lens.max() > n_k:
            raise ValueError(f"kv_lens must lie in [0, n_k = {n_k}], got {kv_lens.tolist()}")


def block_n() -> int:
    """Keys per tile: 64 compiled (K and V tiles of 64 x 128 bf16 pipeline in shared memory);
    16 in the interpreter, so that small tests span many tiles and splits."""
    return 16 if _interpreted() else 64


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
    if _interpreted():
        return choose_num_splits(programs, n_k, INTERPRETER_SMS, min_split_tiles=1)
    return choose_num_splits(programs, n_k, torch.cuda.get_device_properties(device).multi_processor_count)


def _pad_head_dim(t: torch.Tensor, width: int) -> torch.Tensor:
    """Zero columns change no dot product and give zero output columns; keep the last axis contiguous."""
    if t.shape[-1] != width:
        t = torch.nn.functional.pad(t, (0, width - t.shape[-1]))
    return t if t.stride(-1) == 1 else t.contiguous()


def _block_m(n_rows: int, width: int) -> int:
    """Rows per tile: the group's G · n_q rows, a power of two >= 16 (tl.dot's need), at most
    TILE_ELEMENTS / width (the interpreter's 512 / width, so that tests cut groups in row blocks)."""
    cap = (512 if _interpreted() else TILE_ELEMENTS) // width
    return max(16, min(triton.next_power_of_2(n_rows), cap))


def decode_partials(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_lens: torch.Tensor | None = None,
                    num_splits: int | None = None, scale: float | None = None):
    """Kernel 1: each split's attention over its chunk of keys.

    Returns o_part (B, H_q, n_q, S, D) and lse_part (B, H_q, n_q, S), float32; S = num_splits, or
    choose_num_splits's answer when None. Split s covers keys [s·c, (s+1)·c) below kv_lens[b],
    c = keys_per_split(n_k, S).
    """
    _check_inputs(q, k, v, kv_lens, num_splits, scale)
    (B, H_q, n_q, D), (H_kv, n_k) = q.shape, k.shape[1:3]
    group = H_q // H_kv
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    width = max(16, triton.next_power_of_2(D))  # tl.dot and tl.arange want powers of two, >= 16
    q, k, v = (_pad_head_dim(t, width) for t in (q, k, v))
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
                        GROUP=group, HEAD_DIM=width, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
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
    width = max(16, triton.next_power_of_2(D))
    o_part = _pad_head_dim(o_part, width).contiguous()
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
