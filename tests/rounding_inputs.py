"""Inputs under which a backward's sums must stay float32: float16 q, k, v, dO (B, H, n, D) whose
exact gradients a float16 rounding in the wrong place visibly moves (exercises 09, 13 and 14).

Each makes the softmax exact in float16, so that the correct kernel's own rounding (P cast for
tl.dot, O stored in float16) stays small beside the one the bug adds.
"""
import torch

from triton_helpers import DEVICE


def _float16(*tensors):
    return tuple(t.half().to(DEVICE) for t in tensors)


def large_d_inputs(rng, B, H, n_q, n_k, d):
    """Every row's D = rowsum(dO ∘ O) near 16·d (dO's entries near 16, V's near 1), so that float16 D
    is off by up to a quarter of its last place, about 16·d / 4096; q = 0, so P is the exact uniform
    weight over the allowed keys and O's own rounding, incoherent across its columns, is all the
    correct kernel adds. K carries an offset of 1, which moves no softmax: dQ = scale · dS K then
    carries any error in D times 1 on every column (ΣⱼPᵢⱼ(dPᵢⱼ − Dᵢ) = 0 cancels it for the right D)."""
    def normal(n):
        return torch.from_numpy(rng.standard_normal((B, H, n, d)))
    return _float16(torch.zeros(B, H, n_q, d), 1 + 0.5 * normal(n_k), 1 + 0.01 * normal(n_k), 16 + normal(n_q))


def cancelling_dv_inputs(rng, B, H, n_q, n_k, d, tile=16):
    """Every query attends key 0 alone (P = 1 there, exp(-24) elsewhere, below float16's least), and dO's rows carry an
    offset of +64 or -64 that flips every `tile` rows: dV of key 0 adds tile products near ±1024,
    which cancel to a sum near 8. A tile product rounded to float16 first (steps of 1 at 1024) is off
    by up to 0.5; summed in float32, as the correct kernel does, it is exact."""
    q = torch.zeros(B, H, n_q, d)
    q[..., 0] = 8.0  # scores 24 on key 0 and 0 elsewhere at the default scale 1/sqrt(d); no larger, since
    k = torch.from_numpy(rng.standard_normal((B, H, n_k, d)))  # dK and dQ multiply dS's float32 noise by q and k
    k[..., 0] = 0.0
    k[..., 0, :] = 0.0
    k[..., 0, 0] = 3.0 * d ** 0.5
    v = torch.from_numpy(rng.standard_normal((B, H, n_k, d)))
    v[..., 0, :] = 0.0  # dP = dO vᵀ is exactly 0 on key 0 and O, D near 0: no float32 noise of dP − D reaches dQ
    sign = 1 - 2 * ((torch.arange(n_q) // tile) % 2)
    do = 64.0 * sign[:, None] + torch.from_numpy(rng.standard_normal((B, H, n_q, d)))
    return _float16(q, k, v, do)


def dv_summed(product: str = "Pᵀ dO") -> str:
    """The convention cancelling_dv_inputs checks, for a dV that sums `product` over query tiles."""
    return (f"dV = Σ over query tiles of {product}, summed in float32 (tl.dot's accumulator argument) and "
            "rounded once, when stored; here every query attends key 0 alone and dO's rows flip sign every 16 rows")
