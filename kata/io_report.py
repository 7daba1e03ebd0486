"""The IO table printed once exercise 05 passes: the learner's closed forms at real sizes, beside the paper."""
from __future__ import annotations

from types import ModuleType

from tabulate import tabulate

D = 64  # head dimension of GPT-2 medium
BLOCK = 128  # block_q = block_k: a 128 x 64 fp16 tile of Q, K or V is 16 KB of SRAM
SIZES = (1024, 4096, 16384)
HEADS, BATCH, N_GPT2 = 16, 64, 1024  # GPT-2 medium as benchmarked in the paper's Figure 2
BYTES_FP16 = 2
GB = 1e9

PAPER = """\
The paper measured 40.3 GB (standard) vs 4.4 GB (FlashAttention) of HBM reads
and writes, 9.2x, for this model on an A100, forward AND backward (Dao et al.
2022, section 3.2, Figure 2 left)."""
SCOPE = """\
What this model counts: the forward pass of one head, as elements moved between
  HBM and SRAM: Q, K, V, O and L, plus S and P for standard attention.
What it leaves out: the backward pass (standard attention reads S and P again
  and writes dS and dP; FlashAttention recomputes S and P from Q, K, V and L),
  extra passes over S for masking, scaling and dropout, wider softmax dtypes,
  and caches (an L2 hit still counts as HBM traffic)."""


def _io(module: ModuleType, name: str, n: int, causal: bool = False) -> tuple[int, int]:
    reads, writes = getattr(module, name)(n, D, BLOCK, BLOCK, causal=causal)
    return int(reads), int(writes)


def _gb(counts: tuple[int, int]) -> str:
    return f"{sum(counts) * BYTES_FP16 * HEADS * BATCH / GB:.1f} GB"


def table(module: ModuleType) -> str:
    """The IO report, computed with `module`'s standard_attention_io and flash_attention_io."""
    try:
        rows = []
        for n in SIZES:
            std, flash = _io(module, "standard_attention_io", n), _io(module, "flash_attention_io", n)
            rows.append([n, *std, *flash, f"{sum(std) / sum(flash):.2f}x"])
        std, flash = _io(module, "standard_attention_io", N_GPT2), _io(module, "flash_attention_io", N_GPT2)
        causal = _io(module, "flash_attention_io", N_GPT2, causal=True)
    except Exception as error:  # the learner's code: any failure means no table, not a crash
        return (f"IO table skipped: your closed forms raised {type(error).__name__}: {error}\n"
                f"(the table is computed with standard_attention_io and flash_attention_io)")
    headers = ["n", "std reads", "std writes", "flash reads", "flash writes", "std/flash"]
    return "\n".join([
        f"Elements moved by one head, forward, d = {D}, block_q = block_k = {BLOCK}, non-causal",
        "(from your standard_attention_io and flash_attention_io):",
        tabulate(rows, headers, intfmt=",", colalign=("right",) * len(headers)),
        f"The ratio tends to 1 + 2·block_q/d = {1 + 2 * BLOCK / D:g}: FlashAttention re-reads K and V once",
        "per query block, n²·2d/block_q elements: more SRAM, larger blocks, less traffic.",
        "",
        f"GPT-2 medium forward ({HEADS} heads, batch {BATCH}, n = {N_GPT2}, d = {D}, fp16, GB = 1e9 B):",
        f"  standard {_gb(std)}, FlashAttention {_gb(flash)}, {sum(std) / sum(flash):.1f}x "
        f"({_gb(causal)} causal, as GPT-2 is).",
        PAPER,
        "",
        SCOPE,
    ])
