"""The IO tables printed once exercises 05, 08 and 12 pass: the learner's closed forms at real sizes, beside the paper."""
from __future__ import annotations

from types import ModuleType
from typing import Callable

import numpy as np
from tabulate import tabulate

from kata.given.block_mask import BlockMask

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
Dropout: standard attention runs it as a kernel of its own each way (the
  paper's Figure 1): the forward's reads P and writes the dropped P and the
  keep mask, the backward's reads the dropped P's gradient (dO Vᵀ) and the mask
  and writes dP, n² elements each (the mask too, though PyTorch's is a byte).
  FlashAttention moves nothing more: it draws the mask on chip in both passes
  from a seed (exercise 14).
What the model leaves out. Standard: the extra passes over S and P for the
  mask and the scale (PyTorch runs each as a kernel of its own).
FlashAttention: the paper's kernels use other block sizes and loop orders
  (Algorithms 1 and 4: key blocks outside, Q, O, dO, dQ re-read per key block).
Both: the L2 cache (a re-read that hits it counts here as HBM traffic, and
  FlashAttention re-reads the most), and L and D stored in fp32, counted here
  at 2 bytes like the rest."""


def standard_dropout_io(n: int) -> dict[str, tuple[int, int]]:
    """pass -> (reads, writes) in elements that dropout adds to one head of standard attention,
    causal or not: the forward's dropout kernel reads P and writes the dropped P and the keep mask;
    the backward's reads dO Vᵀ (the dropped P's gradient, from 08's kernel 2) and the mask and writes
    dP for 08's kernel 3. The other kernels read the dropped P where they read P. The mask counts as n²
    elements, as the simulator counts any array. FlashAttention adds nothing: exercise 14 draws a
    tile's mask on chip from the seed where it computes P, in the forward and again in the backward."""
    return {"forward": (n * n, 2 * n * n), "backward": (2 * n * n, n * n)}


GPT2_ROWS = [("forward", ("forward",), False, False), ("backward", ("backward",), False, False),
             ("forward + backward", ("forward", "backward"), False, False),
             ("forward + backward, causal", ("forward", "backward"), True, False),
             ("the same, with dropout", ("forward", "backward"), True, True)]


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
        for label, passes, causal, dropout in GPT2_ROWS:
            std, flash = (sum(sum(_io(modules[p], f"{a}_{'attention' if p == 'forward' else 'backward'}_io",
                                      N_GPT2, causal)) for p in passes) for a in ("standard", "flash"))
            std += sum(sum(standard_dropout_io(N_GPT2)[p]) for p in passes) if dropout else 0
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


N_LONG = 65536  # the paper's longest sequences: Path-256, run with block-sparse FlashAttention (section 4.3)
WINDOWS = (1024, 4096)
DOC_LENGTHS = (512, 8192)  # documents packed into the sequence: random lengths in this range
DOC_SEED = 2412  # fixed, so that the table is the same on every run
SPARSE_SCOPE = """\
HBM traffic of block_sparse_flash (Q, K, V, O, L in elements; fp16 MB = 2 bytes
each): Proposition 4's Θ(Nd + N²d²M⁻¹s) counted exactly. s is the fraction of
tiles computed; the traffic falls with it, down to the nd of Q and O. Windows
are sliding (causal); documents are packed, causal within each, their lengths
drawn from {lo}-{hi} with seed {seed}.""".format(lo=DOC_LENGTHS[0], hi=DOC_LENGTHS[1], seed=DOC_SEED)


def document_ids(n: int) -> np.ndarray:
    """The document of each of n positions, ascending: documents of random lengths in DOC_LENGTHS
    (seed DOC_SEED) packed end to end, the last one cut at n."""
    lengths = np.random.default_rng(DOC_SEED).integers(*DOC_LENGTHS, size=n // DOC_LENGTHS[0] + 1)
    return np.searchsorted(np.cumsum(lengths), np.arange(n), side="right")


def interval_masks(n: int) -> dict[str, dict]:
    """The masks of the 64k table and of `--bench sparse`, each causal narrowed by its arguments to
    `interval_bounds`: name -> {} (causal), {'window': w} (sliding) or {'doc_ids': (n,)} (documents)."""
    return {"causal": {}, **{f"window {w // 1024}k": {"window": w} for w in WINDOWS},
            "documents": {"doc_ids": document_ids(n)}}


def interval_bounds(n: int, window: int = 0, doc_ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) key each of n queries may attend: causal (last = the query), and with a window
    no further back than window - 1 keys, with doc_ids (ascending) not before its document's start.
    Each such mask allows one interval of keys per row."""
    q = np.arange(n)
    first = np.zeros(n, dtype=np.int64)
    if window:
        first = np.maximum(q - window + 1, 0)
    if doc_ids is not None:
        first = np.maximum(first, np.searchsorted(doc_ids, doc_ids))  # the first position of each one's document
    return first, q


def row_bounds(n: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name -> (first, last) key each query may attend, for dense attention and `interval_masks`."""
    bounds = {"dense": (np.zeros(n, dtype=np.int64), np.full(n, n - 1))}
    bounds.update({name: interval_bounds(n, **args) for name, args in interval_masks(n).items()})
    return bounds


def tile_grids(first: np.ndarray, last: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(partial, full) tile grids of an interval mask, row i allowing keys first[i]..last[i]: the
    learner's block_mask asks about every pair, 4·10⁹ of them at 64k, too slow for a report. A tile
    has some pair when a row's blocks first // block .. last // block reach it (a running count of
    interval starts and ends), and every pair when each row's wholly covered blocks include it."""
    n = len(first)
    blocks = -(-n // block)
    row_block = np.arange(n) // block
    ends = np.zeros((blocks, blocks + 1), dtype=np.int64)
    np.add.at(ends, (row_block, first // block), 1)
    np.add.at(ends, (row_block, last // block + 1), -1)
    some = np.cumsum(ends, axis=1)[:, :blocks] > 0
    covered_from = -(-first // block)
    covered_to = np.where(last == n - 1, blocks - 1, (last + 1) // block - 1)  # the last block may be ragged
    starts = np.arange(0, n, block)
    lo, hi = np.maximum.reduceat(covered_from, starts), np.minimum.reduceat(covered_to, starts)
    column = np.arange(blocks)
    full = (column >= lo[:, None]) & (column <= hi[:, None])
    return some & ~full, full


def sparse_table(module: ModuleType) -> str:
    """Density and HBM traffic at n = 64k of dense, causal, sliding-window and document masks, from
    `module`'s block_lists, density and block_sparse_io (exercise 12)."""
    try:
        rows = []
        for name, (first, last) in row_bounds(N_LONG).items():
            partial, full = tile_grids(first, last, BLOCK)
            lists = [module.block_lists(grid) for grid in (partial, full, partial.T, full.T)]
            block_mask = BlockMask(N_LONG, N_LONG, BLOCK, BLOCK, *(a for pair in lists for a in pair))
            reads, writes = (int(c) for c in module.block_sparse_io(N_LONG, D, BLOCK, BLOCK, block_mask))
            label = f"{document_ids(N_LONG)[-1] + 1} documents" if name == "documents" else name
            rows.append([label, float(module.density(block_mask)), reads, writes, (reads + writes) * BYTES_FP16 / 1e6])
    except Exception as error:  # the learner's code: any failure means no table, not a crash
        return (f"Block-sparse table skipped: {type(error).__name__}: {error}\n"
                f"(it is computed with your block_lists, density and block_sparse_io)")
    dense = rows[0][2] + rows[0][3]
    for row in rows:
        row.append(f"{dense / (row[2] + row[3]):.1f}x")
    headers = ["mask", "density s", "reads", "writes", "MB", "vs dense"]
    return "\n".join([
        f"Block-sparse FlashAttention, one head, n = {N_LONG:,}, d = {D}, blocks of {BLOCK}",
        "(from your block_lists, density and block_sparse_io):",
        tabulate(rows, headers, intfmt=",", floatfmt=("", ".4f", "", "", ",.1f", ""), colalign=("left",) + ("right",) * 5),
        SPARSE_SCOPE,
    ])
