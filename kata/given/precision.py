"""How tl.dot multiplies float32 in the Triton exercises: as torch's own matmuls do.

On a GPU with tensor cores, Triton's tl.dot rounds float32 inputs to TF32 (10 bits of mantissa)
unless told input_precision="ieee". torch multiplies float32 in full float32 unless the user
asked it for TF32: torch.set_float32_matmul_precision("high") or "medium", or
torch.backends.cuda.matmul.allow_tf32 = True (torch 2.9 and later also read both through
torch.backends.cuda.matmul.fp32_precision, "tf32" when asked). The kernels follow torch: each
wrapper passes dot_precision(q.dtype) as a constexpr, and every tl.dot takes it as input_precision.
Triton ignores input_precision for float16 and bfloat16, whose products are exact on tensor cores.
"""
import torch


def tf32_asked() -> bool:
    """Whether the user asked torch for TF32 in float32 matmuls."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch 2.9 on: the old settings read this one, and raise once it is set
        return matmul.fp32_precision == "tf32"
    return torch.get_float32_matmul_precision() in ("high", "medium") or matmul.allow_tf32


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's input_precision for inputs of `dtype`: "tf32" for float32 where TF32 was asked for,
    else "ieee" (full float32; for float16 and bfloat16 Triton ignores it)."""
    return "tf32" if dtype == torch.float32 and tf32_asked() else "ieee"
