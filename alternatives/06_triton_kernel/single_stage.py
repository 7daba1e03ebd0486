"""Alternative: one masked loop stage over the visible keys, still stopping at the causal diagonal.

lse comes from m·ln(2) + ln(l); o is divided by max(l, 1e-30).
"""
import math
import os

import torch
import triton
import triton.language as tl

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256
TUNE_ABOVE = 2**25  # B*H*n_q*n_k scores: smaller problems run a fixed config, tuning costs more than it saves
TUNING = [  # on an H200 in bfloat16, 128 x 64 with 8 warps wins most cells; 64 x 64 wins causal N <= 2048
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=4, num_stages=3),  # two programs per SM at D <= 64
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3),  # two programs per SM at D = 128
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2),  # the smallest: D = 256 fits it
]


def _fitting(configs, named_args, **kwargs):
    """Keep the configs whose Q and K tiles hold at most 128 x 128 elements at this head dimension."""
    return [c for c in configs if max(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) * kwargs["HEAD_DIM"] <= 128 * 128]


@triton.jit
def _load_rows(ptrs, rows, n_rows, MASKED: tl.constexpr):
    """Load a (rows, HEAD_DIM) tile; when MASKED, rows at or past n_rows read as 0 and touch no memory."""
    if MASKED:
        tile = tl.load(ptrs, mask=(rows < n_rows)[:, None], other=0.0)
    else:
        tile = tl.load(ptrs)
    return tile


@triton.jit
def _tile_ptrs(base, b, h, stride_b, stride_h, stride_n, rows, HEAD_DIM: tl.constexpr):
    """Pointers to rows `rows` (all HEAD_DIM columns) of the (b, h) matrix of a (B, H, n, HEAD_DIM) tensor."""
    start = base + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h  # B*H*n*D may pass 2**31
    return start + rows[:, None] * stride_n + tl.arange(0, HEAD_DIM)[None, :]


@triton.jit
def _attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, lo, hi, n_keys, qk_scale,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Fold key tiles [lo, hi) into the running state of one query block.

    acc (BLOCK_M, HEAD_DIM), l and m (BLOCK_M,): float32 state, m in base-2 units.
    q (BLOCK_M, HEAD_DIM); k_ptrs, v_ptrs point at keys 0..BLOCK_N-1; rows: the block's query indices.
    MASKED: mask keys at or past n_keys, and (CAUSAL) keys after the query. Returns acc, l, m.
    """
    for start in tl.range(lo, hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        s = tl.dot(q, tl.trans(_load_rows(k_ptrs + start * stride_kn, keys, n_keys, MASKED))) * qk_scale
        if MASKED:
            allowed = (keys < n_keys)[None, :]
            if CAUSAL:
                allowed = allowed & (rows[:, None] >= keys[None, :])
            s = tl.where(allowed, s, float("-inf"))
        m_tile = tl.max(s, 1)
        m_new = tl.where(m_tile > m, m_tile, m)
        alpha = tl.math.exp2(m - m_new)  # rescales what l and acc summed under the old max
        p = tl.math.exp2(s - m_new[:, None])
        v = _load_rows(v_ptrs + start * stride_vn, keys, n_keys, MASKED)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        l = l * alpha + tl.sum(p, 1)
        m = m_new
    return acc, l, m


@triton.jit
def _attn_fwd(Q, K, V, O, LSE, KV_LENS, qk_scale,
              stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
              H, n_q, n_k,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
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
    q = _load_rows(_tile_ptrs(Q, b, h, stride_qb, stride_qh, stride_qn, rows, HEAD_DIM), rows, n_q, True)
    k_ptrs = _tile_ptrs(K, b, h, stride_kb, stride_kh, stride_kn, tl.arange(0, BLOCK_N), HEAD_DIM)
    v_ptrs = _tile_ptrs(V, b, h, stride_vb, stride_vh, stride_vn, tl.arange(0, BLOCK_N), HEAD_DIM)

    n_keys = n_k
    if KV_LENS is not None:
        n_keys = tl.load(KV_LENS + b)
    visible_end = n_keys
    if CAUSAL:  # no key past the block's last row is visible: those tiles are never loaded
        visible_end = tl.minimum(n_keys, (block + 1) * BLOCK_M)

    # One stage, every tile masked: simpler, at the cost of the mask on tiles that need none.
    acc, l, m = _attn_tiles(tl.zeros([BLOCK_M, HEAD_DIM], tl.float32), tl.zeros([BLOCK_M], tl.float32),
                            tl.full([BLOCK_M], float("-inf"), tl.float32), q, k_ptrs, v_ptrs, stride_kn, stride_vn,
                            rows, 0, visible_end, n_keys, qk_scale, True, CAUSAL, BLOCK_N)

    # l = 0 only for a batch with kv_lens[b] = 0: acc is 0 there, so divide by 1; log2(0) = -inf.
    o = acc / tl.maximum(l, 1e-30)[:, None]
    lse = m * 0.6931471805599453 + tl.log(l)  # m is base 2: m·ln(2) + ln(l) = (m + log2(l))·ln(2)
    in_bounds = rows < n_q
    tl.store(_tile_ptrs(O, b, h, stride_ob, stride_oh, stride_on, rows, HEAD_DIM), o.to(O.dtype.element_ty),
             mask=in_bounds[:, None])
    tl.store(LSE + bh.to(tl.int64) * n_q + rows, lse, mask=in_bounds)


_attn_fwd_tuned = triton.autotune(TUNING, key=["n_q", "n_k", "HEAD_DIM", "CAUSAL"],
                                  prune_configs_by={"early_config_prune": _fitting})(_attn_fwd)


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _check_inputs(q, k, v, kv_lens, scale) -> None:
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
    (B, H, n_q, D), n_k = q.shape, k.shape[2]
    if k.shape != v.shape or k.shape[:2] != (B, H) or k.shape[3] != D:
        raise ValueError(f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: "
                         f"need q (B, H, n_q, D) and k, v both (B, H, n_k, D)")
    if min(B, H, n_q, n_k) < 1:
        raise ValueError(f"empty input: B, H, n_q, n_k must be >= 1, got {B}, {H}, {n_q}, {n_k}")
    if D > MAX_HEAD_DIM:
        raise ValueError(f"head dimension D = {D} is over the {MAX_HEAD_DIM} this kernel supports")
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale}")
    if kv_lens is not None:
        if (not isinstance(kv_lens, torch.Tensor) or kv_lens.shape != (B,)
                or kv_lens.dtype not in (torch.int32, torch.int64)):
            raise ValueError(f"kv_lens must be an int32 or int64 tensor of shape ({B},), got "
                             f"{getattr(kv_lens, 'dtype', type(kv_lens))} {tuple(getattr(kv_lens, 'shape', ()))}")
        if kv_lens.device != q.device:
            raise ValueError(f"kv_lens is on {kv_lens.device}, q on {q.device}: they must share one device")
        if kv_lens.min() < 0 or kv_lens.max() > n_k:
            raise ValueError(f"kv_lens must lie in [0, n_k = {n_k}], got {kv_lens.tolist()}")


def _fixed_config(width: int) -> dict:
    """Untuned tiles for small problems; the interpreter's 32 x 16 make even tiny tests span several tiles."""
    if _interpreted():
        return dict(BLOCK_M=32, BLOCK_N=16)
    return dict(BLOCK_M=64, BLOCK_N=64 if width <= 128 else 32)


def _pad_head_dim(t: torch.Tensor, width: int) -> torch.Tensor:
    """Zero columns change no dot product and give zero output columns; keep the last axis contiguous."""
    if t.shape[-1] != width:
        t = torch.nn.functional.pad(t, (0, width - t.shape[-1]))
    return t if t.stride(-1) == 1 else t.contiguous()


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None, kv_lens: torch.Tensor | None = None):
    """softmax(scale * q k^T) v, fused. q (B, H, n_q, D), k and v (B, H, n_k, D); kv_lens (B,) or None.

    Returns o (B, H, n_q, D) in q's dtype and lse (B, H, n_q) float32, natural log.
    """
    _check_inputs(q, k, v, kv_lens, scale)
    (B, H, n_q, D), n_k = q.shape, k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    width = max(16, triton.next_power_of_2(D))  # tl.dot and tl.arange want powers of two, >= 16
    q, k, v = (_pad_head_dim(t, width) for t in (q, k, v))
    o = torch.empty_like(q)
    lse = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    if kv_lens is not None:
        kv_lens = kv_lens.to(torch.int32)
    args = (q, k, v, o, lse, kv_lens, scale * 1.4426950408889634,  # log2(e): exp(x) = exp2(x log2 e)
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3], H, n_q, n_k)
    # One grid axis for (query block, batch·head): CUDA's second and third axes stop at 65535
    # programs, and B·H passes that when many short sequences are decoded at once.
    if _interpreted() or B * H * n_q * n_k < TUNE_ABOVE:
        fixed = _fixed_config(width)
        grid = (triton.cdiv(n_q, fixed["BLOCK_M"]) * B * H,)
        _attn_fwd[grid](*args, HEAD_DIM=width, CAUSAL=bool(causal), **fixed, num_warps=4, num_stages=2)
    else:
        grid = lambda meta: (triton.cdiv(n_q, meta["BLOCK_M"]) * B * H,)  # noqa: E731
        _attn_fwd_tuned[grid](*args, HEAD_DIM=width, CAUSAL=bool(causal))
    return o[..., :D], lse
