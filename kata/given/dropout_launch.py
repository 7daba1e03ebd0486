"""How exercise 14 runs its kernels: the input checks, the autograd wrapper, the tiles, the grid.

    flash_attention(Kernels(...), q, k, v, causal, scale, dropout_p, seed)
    dropout_mask(mask_kernel, seed, dropout_p, B, H, n_q, n_k, device)

check the inputs and launch the exercise's kernels, which they are handed at every call (so the
kernels launched are always the ones the exercise file holds now): the forward, then in the
backward D = rowsum(dO ∘ O), the dK, dV kernel and the dQ kernel, each with one program per block
of rows of a (batch, head), 06's and 09's grids; dropout_mask's kernel one program per tile.
"""
import math
import numbers
import operator
from typing import NamedTuple

import torch
import triton

from kata.given import tiles
from kata.given.inputs import check_inputs
from kata.given.launch import LOG2E, backward_tiles, interpreted, launch
from kata.given.precision import dot_precision

MAX_SEED = 2**63  # Triton passes a seed as a 64-bit integer


class Kernels(NamedTuple):
    """Exercise 14's @triton.jit kernels, each beside its autotuned(...) self."""
    fwd: object
    fwd_tuned: object
    dkdv: object
    dkdv_tuned: object
    dq: object
    dq_tuned: object


def kernel_tiles(width: int) -> dict:
    """The fixed tiles of each kernel ("fwd", "dkdv", "dq", "mask") for small problems and the interpreter,
    06's and 09's: the mask depends on none of them."""
    forward = dict(BLOCK_M=32, BLOCK_N=16) if interpreted() else dict(BLOCK_M=64, BLOCK_N=64 if width <= 128 else 32)
    return dict(fwd=forward, **backward_tiles(width), mask=dict(BLOCK_M=64, BLOCK_N=64))


def check_dropout(dropout_p, seed) -> tuple[float, int]:
    """(dropout_p, seed) as a float and an int, or ValueError: p in [0, 1), seed an integer in [0, MAX_SEED)."""
    try:
        seed = operator.index(seed)
    except TypeError:
        raise ValueError(f"seed must be an integer, got {type(seed).__name__} {seed!r}") from None
    if not 0 <= seed < MAX_SEED:
        raise ValueError(f"seed must lie in [0, 2**63), got {seed}")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or not 0 <= dropout_p < 1:
        raise ValueError(f"dropout_p must be a number in [0, 1), got {dropout_p!r}: the probability that an "
                         f"attention weight is dropped (kept ones weigh 1/(1 - dropout_p))")
    return float(dropout_p), seed


def dropout_mask(mask_kernel, seed: int, dropout_p: float, B: int, H: int, n_q: int, n_k: int,
                 device=None) -> torch.Tensor:
    """The keep mask mask_kernel draws into a (B, H, n_q, n_k) int8 tensor, as bool; device: the kernels'
    device when None (CUDA, or the CPU where the kernels run interpreted)."""
    dropout_p, seed = check_dropout(dropout_p, seed)
    if min(B, H, n_q, n_k) < 1:
        raise ValueError(f"B, H, n_q and n_k must be >= 1, got {(B, H, n_q, n_k)}")
    device = torch.device(device if device is not None else "cpu" if interpreted() else "cuda")
    mask = torch.empty((B, H, n_q, n_k), dtype=torch.int8, device=device)
    block = kernel_tiles(16)["mask"]
    grid = (triton.cdiv(n_q, block["BLOCK_M"]) * triton.cdiv(n_k, block["BLOCK_N"]) * B * H,)
    mask_kernel[grid](mask, seed, dropout_p, n_q, n_k, **block)
    return mask.view(torch.bool)


def _sizes(q, k, causal: bool, dropout_p: float) -> dict:
    """What every launch of the three kernels shares: the problem's size and the constexprs."""
    (B, H, n_q, width), n_k = q.shape, k.shape[2]
    return dict(batch_heads=B * H, scores=B * H * n_q * n_k, HEAD_DIM=width, CAUSAL=causal,
                DROPOUT=dropout_p > 0, PRECISION=dot_precision(q.dtype))


class AttentionDropout(torch.autograd.Function):
    """o = dropout(softmax(scale · q kᵀ)) v; the forward saves q, k, v, o, lse and the seed, the backward
    rebuilds P and the mask."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float, dropout_p: float, seed: int, kernels: Kernels):
        head_dim = q.shape[-1]
        width = tiles.padded_width(head_dim)
        q, k, v = (tiles.pad_head_dim(t, width) for t in (q, k, v))
        (B, H, n_q, _), n_k = q.shape, k.shape[2]
        o = torch.empty_like(q)
        lse = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
        args = (q, k, v, o, lse, seed, dropout_p, scale * LOG2E,
                *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3], H, n_q, n_k)
        launch(kernels.fwd, kernels.fwd_tuned, args, rows=n_q, block="BLOCK_M", fixed=kernel_tiles(width)["fwd"],
               **_sizes(q, k, causal, dropout_p))
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale, ctx.dropout_p, ctx.seed, ctx.head_dim = causal, scale, dropout_p, seed, head_dim
        ctx.kernels = kernels
        return o[..., :head_dim]

    @staticmethod
    def backward(ctx, do):
        """dq, dk, dv in the dtypes of q, k, v: D, then the dK, dV and dQ kernels."""
        q, k, v, o, lse = ctx.saved_tensors
        kernels = ctx.kernels
        do = tiles.pad_head_dim(do, q.shape[-1])
        (_, H, n_q, width), n_k = q.shape, k.shape[2]
        delta = (o.float() * do.float()).sum(-1).contiguous()  # D = rowsum(dO ∘ O), as in 09
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        fixed, sizes = kernel_tiles(width), _sizes(q, k, ctx.causal, ctx.dropout_p)
        shared = (ctx.seed, ctx.dropout_p, ctx.scale * LOG2E, ctx.scale,
                  *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3])
        launch(kernels.dkdv, kernels.dkdv_tuned, (q, k, v, do, dk, dv, lse, delta, *shared,
                                                  *dk.stride()[:3], *dv.stride()[:3], H, n_q, n_k),
               rows=n_k, block="BLOCK_N", fixed=fixed["dkdv"], **sizes)
        launch(kernels.dq, kernels.dq_tuned, (q, k, v, do, dq, lse, delta, *shared, *dq.stride()[:3], H, n_q, n_k),
               rows=n_q, block="BLOCK_M", fixed=fixed["dq"], **sizes)
        d = ctx.head_dim
        return dq[..., :d], dk[..., :d], dv[..., :d], None, None, None, None, None


def flash_attention(kernels: Kernels, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None, dropout_p: float = 0.0, seed: int = 0) -> torch.Tensor:
    """dropout(softmax(scale · q kᵀ)) v by `kernels`, differentiable; q (B, H, n_q, D), k and v (B, H, n_k, D).
    ValueError, before any launch, for inputs the kernels cannot take."""
    check_inputs(q, k, v, scale)
    dropout_p, seed = check_dropout(dropout_p, seed)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return AttentionDropout.apply(q, k, v, bool(causal), scale, dropout_p, seed, kernels)
