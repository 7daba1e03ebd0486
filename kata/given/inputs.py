"""What the Triton wrappers check before they launch anything.

A kernel handed a wrong shape reads past its tensors or returns garbage without a word, so each
wrapper first calls check_inputs, which raises ValueError naming the first problem it finds: a
tensor that is not 4-D, dtypes or devices that differ, shapes that do not fit together, an empty
axis, a head dimension over MAX_HEAD_DIM, a scale that is not positive, bad kv_lens.
"""
import math

import torch

from kata.given.launch import interpreted

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256  # the widest head the kernels are tested at, and the flash-attn library's limit too


def check_inputs(q, k, v, scale, kv_lens=None, grouped_heads: bool = False) -> None:
    """Raise ValueError naming the first problem with the inputs of attention.

    q (B, H, n_q, D); k and v (B, H, n_k, D), or with grouped_heads (B, H_kv, n_k, D), H a multiple
    of H_kv; one dtype of DTYPES, one device (CUDA, or the CPU where the kernels run interpreted); every
    axis at least 1 long; D <= MAX_HEAD_DIM; scale None or positive and finite; kv_lens None or an
    int tensor (B,) on q's device with entries in [0, n_k].
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.ndim != 4:
            raise ValueError(f"{name} must be a 4-D torch tensor (B, H, n, D), got {getattr(t, 'shape', type(t))}")
        if t.dtype not in DTYPES or t.dtype != q.dtype:
            raise ValueError(f"{name} is {t.dtype}: q, k and v must share one dtype of float16, bfloat16, float32")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}: q, k and v must share one device")
    if q.device.type != "cuda" and not interpreted():
        raise ValueError(f"tensors are on {q.device}: the kernels run compiled here, on CUDA tensors (.cuda())")
    if interpreted() and q.dtype == torch.bfloat16:
        raise ValueError("dtype bfloat16 under TRITON_INTERPRET=1: Triton's interpreter multiplies the raw bits "
                         "of bfloat16 in tl.dot and returns garbage; use float32 (or float16) on the CPU")
    (B, H, n_q, D), (H_kv, n_k) = q.shape, k.shape[1:3]
    q_heads, kv_heads = ("H_q", "H_kv") if grouped_heads else ("H", "H")
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D or not (grouped_heads or H_kv == H):
        raise ValueError(f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: "
                         f"need q (B, {q_heads}, n_q, D) and k, v both (B, {kv_heads}, n_k, D)")
    if min(B, H, n_q, H_kv, n_k) < 1:
        raise ValueError(f"empty input: q {tuple(q.shape)}, k {tuple(k.shape)}: B, the heads, n_q and n_k "
                         f"must be >= 1")
    if H % H_kv:
        raise ValueError(f"H_q = {H} query heads is not a multiple of H_kv = {H_kv} kv heads: "
                         f"each kv head must serve H_q / H_kv query heads")
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
