"""torch's float32 matmul setting, which the Triton kernels follow (kata/given/precision.py), changed
for a test and put back after."""
import contextlib


@contextlib.contextmanager
def float32_matmul_precision(setting: str):
    """torch.set_float32_matmul_precision(setting) within the block ("highest": full float32, torch's
    default; "high" or "medium": TF32 allowed); the setting before it after, allow_tf32 with it."""
    import torch
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(setting)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)
