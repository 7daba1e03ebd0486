"""The IO tables printed once exercises 05 and 08 pass: the learner's closed forms at real sizes, beside the paper."""
from __future__ import annotations

from types import ModuleType
from typing import Callable

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
What it leaves out: the backward pass (exercise 08: standard attention reads P,
  dP and dS and writes dP and dS; FlashAttention recomputes P from Q, K and L),
  extra passes over S for masking, scaling and dropout, wider softmax dtypes,
  and caches (an L2 hit still counts as HBM traffic)."""


def _io(module: ModuleType, name: str, n: int, causal: bool = False) -> tuple[int, int]:
    reads, writes = getattr(module, name)(n, D, BLOCK, BLOCK, causal=causal)
    return int(reads), int(writes)


def _gb(elements: int) -> str:
    """Elements moved by one head, as GB moved by the whole GPT-2 medium layer."""
    return f"{elements * BYTES_FP16 * HEADS * BATCH / GB:.1f} GB"


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
        f"  standard {_gb(sum(std))}, FlashAttention {_gb(sum(flash))}, {sum(std) / sum(flash):.1f}x "
        f"({_gb(sum(causal))} causal, as GPT-2 is).",
        PAPER,
        "",
        SCOPE,
    ])


BACKWARD_SCOPE = """\
What the model leaves out. Standard: the extra passes over S and P for the
  mask, the scale and dropout (PyTorch runs each as a kernel of its own: the
  paper's Figure 1), and the dropout mask kept for the backward.
FlashAttention: the paper's kernels use other block sizes and loop orders
  (Algorithms 1 and 4: key blocks outside, Q, O, dO, dQ re-read per key block).
Both: the L2 cache (a re-read that hits it counts here as HBM traffic, and
  FlashAttention re-reads the most), and L and D stored in fp32, counted here
  at 2 bytes like the rest."""


GPT2_ROWS = [("forward", ("forward",), False), ("backward", ("backward",), False),
             ("forward + backward", ("forward", "backward"), False),
             ("forward + backward, causal", ("forward", "backward"), True)]


def training_table(forward: Callable[[], ModuleType], backward: Callable[[], ModuleType]) -> str:
    """Forward + backward IO for the paper's Figure 2 setting, from 05's and 08's closed forms
    (`forward` and `backward` load the two modules)."""
    try:
        modules = {"forward": forward(), "backward": backward()}
        rows = []
        for n in SIZES:
            std, flash = (_io(modules["backward"], f"{a}_backward_io", n) for a in ("standard", "flash"))
            rows.append([n, *std, *flash, f"{sum(std) / sum(flash):.2f}x"])
        gpt2 = []
        for label, passes, causal in GPT2_ROWS:
            std, flash = (sum(sum(_io(modules[p], f"{a}_{'attention' if p == 'forward' else 'backward'}_io",
                                      N_GPT2, causal)) for p in passes) for a in ("standard", "flash"))
            gpt2.append([label, _gb(std), _gb(flash), f"{std / flash:.1f}x"])
    except Exception as error:  # the learner's code: any failure means no table, not a crash
        return (f"Forward + backward IO table skipped: {type(error).__name__}: {error}\n(it is computed "
                f"with 05's standard_attention_io, flash_attention_io and 08's standard_backward_io, "
                f"flash_backward_io)")
    gpt2.append(["paper, measured (A100)", "40.3 GB", "4.4 GB", f"{40.3 / 4.4:.1f}x"])
    headers = ["n", "std reads", "std writes", "flash reads", "flash writes", "std/flash"]
    return "\n".join([
        f"Backward: elements moved by one head, d = {D}, block_q = block_k = {BLOCK},",
        "non-causal (from your standard_backward_io and flash_backward_io):",
        tabulate(rows, headers, intfmt=",", colalign=("right",) * len(headers)),
        "",
        f"GPT-2 medium ({HEADS} heads, batch {BATCH}, n = {N_GPT2}, d = {D}, fp16): HBM reads + writes",
        "in GB (1e9 B), from your 05 and 08 closed forms, beside the paper's Figure 2:",
        tabulate(gpt2, ["", "standard", "FlashAttention", "std/flash"], colalign=("left", "right", "right", "right")),
        "",
        BACKWARD_SCOPE,
    ])
