"""Time exercise 13's block-sparse attention against FlexAttention and dense causal attention.

    python grader.py --bench sparse [--n 8192 16384 32768 65536] [--mask causal window-1k window-4k documents]
                                    [--pass forward|backward|both] [--rounds R] [--plot PATH]
                                    [--no-plot]

Every cell is bfloat16 with B·n = 65536 tokens (B = 65536 // n), H = 16, D = 128, and one block mask of
128 × 128 tiles for every (batch, head). The masks are the 64k table's (kata/tools/io_report.py):
causal, sliding windows of 1k and 4k keys, and packed documents, their lengths drawn from 512-8192
with a fixed seed, causal within each. Methods: yours (the target folder's 13: its mask objects,
block_mask and block_sparse_attention), FlexAttention (torch.compile(flex_attention) with
create_block_mask of the same mask written as a mask_mod, compiled before it is timed), and dense
causal attention: SDPA with is_causal=True on every mask, the baseline of the speed-ups. Yours is
checked against FlexAttention once per cell (o, and dq, dk, dv in the forward + backward), then the
methods are timed in turn, --rounds times, each time with triton.testing.do_bench (median ms); a
method's time is its fastest round, so that a slow spell of the GPU falls on every method, not on
one, and the summary gives the range of the rounds' own ratios. Density: the tiles the block mask
computes (partial and full) over all T_r·T_c. TFLOP/s count only the pairs the mask keeps:
4·pairs·D per (batch, head) for the forward, 2.5 times that for the backward. A column that cannot
run on this GPU (out of memory, FlexAttention not compiling) or is not started gets a note; any
other error stops the benchmark, naming its column. Without a CUDA device it says so and returns 2.
"""
from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path

from kata.bench.common import (BACKWARD_FLOPS, cell, checked, checked_training, default_backend, fmt, from_exercise,
                               geomean, gpu_torch, gradients, guarded, pyplot, timed)
from kata.bench.common import speedup as cell_speedup
from kata.exercises import SOLUTIONS_DIR
from kata.tools import io_report

TOKENS, HEADS, HEAD_DIM, BLOCK = 65536, 16, 128, 128  # B·n, H, D of every cell; the block masks' tiles
SIZES = [8192, 16384, 32768, 65536]
YOURS, REFERENCE, FLEX, DENSE = "yours", "reference", "flex", "dense causal"
PASSES = {"fwd": "forward", "train": "forward + backward"}
ROUNDS = 5  # each method's time: the fastest of this many medians, the methods taking turns
# The reference's goal: the 4k window at n = 64k computes 1/8 of the causal tiles, so it should run
# at least 6 times as fast as dense causal attention.
TARGET_MASK, TARGET_N, TARGET_SPEEDUP = "window 4k", 65536, 6.0


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="grader.py --bench sparse", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    masks = list(io_report.interval_masks(1))
    p.add_argument("--n", type=int, nargs="+", default=SIZES, help="sequence lengths")
    p.add_argument("--mask", dest="masks", nargs="+", default=masks, choices=masks, metavar="MASK",
                   type=lambda name: name.replace("-", " "), help="masks: causal window-1k window-4k documents")
    p.add_argument("--pass", dest="passes", choices=["forward", "backward", "both"], default="both",
                   help="time the forward, the forward + backward, or both")
    p.add_argument("--rounds", type=int, default=ROUNDS,
                   help=f"time the methods in turn this many times, keeping each one's fastest (default {ROUNDS})")
    p.add_argument("--plot", type=Path, default=Path("bench_13.png"), help="where the plot goes (needs matplotlib)")
    p.add_argument("--no-plot", action="store_true", help="no plot")
    return p.parse_args(argv)


def flex_mask_mod(window: int = 0, doc_ids=None):
    """A mask of `io_report.interval_bounds` as FlexAttention's mask_mod(b, h, q_idx, kv_idx) -> bool:
    doc_ids (a tensor on the device) when given, else a window when given, else causal."""
    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    def sliding(b, h, q_idx, kv_idx):  # q_idx - window: one per query, no n x n array of ints
        return (kv_idx <= q_idx) & (kv_idx > q_idx - window)

    def documents(b, h, q_idx, kv_idx):
        return (doc_ids[q_idx] == doc_ids[kv_idx]) & (kv_idx <= q_idx)
    return documents if doc_ids is not None else sliding if window else causal


def columns(torch, target: Path, device: str = "cuda", compiled: bool = True) -> dict:
    """name -> make(n, block, window=0, doc_ids=None) -> attention(q, k, v) -> o, differentiable, for the
    mask that `io_report.interval_masks` describes (doc_ids in NumPy). make builds the block mask, outside
    the timing. The first name is 13's column: yours, or the reference when the target is solutions/.
    compiled=False: FlexAttention runs eagerly (the CPU tests: compiling takes minutes)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    mine = REFERENCE if target.resolve() == SOLUTIONS_DIR.resolve() else YOURS
    causal, sliding_window, document_mask, block_mask, attention = from_exercise(
        mine, "13", target, "causal", "sliding_window", "document_mask", "block_mask", "block_sparse_attention")
    flex = torch.compile(flex_attention, dynamic=False, fullgraph=True) if compiled else flex_attention
    ids = lambda doc_ids: None if doc_ids is None else torch.as_tensor(doc_ids, device=device)  # noqa: E731

    def make_mine(n, block, window=0, doc_ids=None):
        mask = document_mask(ids(doc_ids)) if doc_ids is not None else sliding_window(window) if window else causal
        bm = block_mask(mask, n, n, block, block)
        return lambda q, k, v: attention(q, k, v, bm, mask)

    def make_flex(n, block, window=0, doc_ids=None):
        bm = create_block_mask(flex_mask_mod(window, ids(doc_ids)), None, None, n, n, device=device,
                               BLOCK_SIZE=block)
        return lambda q, k, v: flex(q, k, v, block_mask=bm)

    def make_dense(n, block, window=0, doc_ids=None):
        return partial(torch.nn.functional.scaled_dot_product_attention, is_causal=True)
    return {mine: make_mine, FLEX: make_flex, DENSE: make_dense}


def kept_pairs(first, last) -> int:
    """The (query, key) pairs a mask keeps, row i keeping keys first[i]..last[i]."""
    return int((last - first + 1).sum())


def density(first, last, block: int) -> float:
    """The fraction of block × block tiles that the block mask computes (partial or full)."""
    partial_tiles, full_tiles = io_report.tile_grids(first, last, block)
    return float((partial_tiles | full_tiles).mean())


def flex_reference(torch, fn, q, k, v, do, training: bool) -> dict:
    """FlexAttention's answer that yours is checked against, {'out', 'compile_s'} (its first call
    compiles it: the seconds that took), or {'note'}; out is o, or (dq, dk, dv) when `training`."""
    def first_call():
        start = time.perf_counter()
        out = gradients(fn, q, k, v, do) if training else fn(q, k, v)
        torch.cuda.synchronize()
        return {"out": out, "compile_s": time.perf_counter() - start}
    return guarded(torch, FLEX, first_call)


def runcell(torch, table: dict, row: dict, mask: dict, tensors, passes: list[str], rounds: int) -> None:
    """Time yours and FlexAttention on one (mask, n) into row[pass][name], in turn, `rounds` times; the
    dense column is the caller's, being the same for every mask."""
    torch.compiler.reset()  # FlexAttention compiles afresh in each cell: no recompile limit is met
    q, k, v, do = tensors
    flops = 4 * row["pairs"] * HEAD_DIM * row["B"] * HEADS
    made = {name: guarded(torch, name, lambda make=make: {"fn": make(row["n"], BLOCK, **mask)})
            for name, make in table.items() if name != DENSE}
    mine = next(iter(table))
    for key in passes:
        training = key == "train"
        ref = flex_reference(torch, made[FLEX]["fn"], q, k, v, do, training) if "fn" in made[FLEX] else made[FLEX]
        row[key]["flex compile s"] = ref.get("compile_s")
        ready = {FLEX: ref, mine: made[mine]}  # a note, or a column that runs
        for name, expected in ((FLEX, None), (mine, ref.get("out"))):  # yours unchecked if flex did not run
            fn = made[name].get("fn")
            if "note" not in ready[name]:
                ready[name] = (checked_training(torch, name, fn, q, k, v, do, expected, flops) if training
                               else checked(torch, name, partial(fn, q, k, v), expected, flops))
        row[key].update(timed(torch, ready, rounds))
        del ref, ready


def dense_cells(torch, make, n: int, B: int, tensors, passes: list[str], rounds: int) -> dict:
    """pass -> the dense causal column's numbers at this n (TFLOP/s over the causal pairs), the fastest
    of `rounds` medians as the other columns' are, and 'backend': the one SDPA picks."""
    q, k, v, do = tensors
    fn, flops = make(n, BLOCK), 4 * (n * (n + 1) // 2) * HEAD_DIM * B * HEADS
    ready = {key: checked_training(torch, DENSE, fn, q, k, v, do, None, flops) if key == "train"
             else checked(torch, DENSE, partial(fn, q, k, v), None, flops) for key in passes}
    cells = {key: timed(torch, {DENSE: ready[key]}, rounds)[DENSE] for key in passes}
    return {**cells, "backend": default_backend(torch, q, k, v, True)}


def run_cells(torch, args, table: dict) -> list[dict]:
    passes = {"forward": ["fwd"], "backward": ["train"], "both": ["fwd", "train"]}[args.passes]
    grid = [(n, name) for n in dict.fromkeys(args.n) for name in dict.fromkeys(args.masks)]
    rows, dense, tensors = [], {}, None
    for number, (n, name) in enumerate(grid, start=1):
        B = max(1, TOKENS // n)
        if n not in dense:  # a new n: new inputs, and the dense column timed once for every mask
            del tensors
            gen = torch.Generator(device="cuda").manual_seed(n)
            tensors = [torch.randn(B, HEADS, n, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
                       for _ in range(4)]
            dense[n] = dense_cells(torch, table[DENSE], n, B, tensors, passes, args.rounds)
        mask = io_report.interval_masks(n)[name]
        first, last = io_report.interval_bounds(n, **mask)
        row = {"mask": name, "n": n, "B": B, "density": density(first, last, BLOCK), "pairs": kept_pairs(first, last),
               "backend": dense[n]["backend"], **{key: {DENSE: dense[n][key]} for key in passes}}
        runcell(torch, table, row, mask, tensors, passes, args.rounds)
        rows.append(row)
        print(f"[{number}/{len(grid)}] {name} n={n} B={B} density {row['density']:.3f}: {_progress(row, table)}",
              flush=True)
    return rows


def _progress(row: dict, table: dict) -> str:
    return "; ".join(f"{PASSES[key]} ms " + ", ".join(f"{name} {cell(row[key][name], 'ms')}" for name in table)
                     + f" (flex compiled in {fmt(row[key]['flex compile s'], '.0f')} s)"
                     for key in PASSES if key in row)


def speedup(row: dict, key: str, fast: str, slow: str) -> float | None:
    """How many times faster `fast` is than `slow` in pass `key`: time of slow / time of fast."""
    return cell_speedup(row[key], fast, slow)


def report(rows: list[dict], mine: str) -> str:
    """One table per pass measured, the baseline and the ratios named above it, and the summary lines."""
    from tabulate import tabulate
    backends = ", ".join(sorted({r["backend"] for r in rows}))
    out = [f"speed-up = {DENSE} ms / {mine} ms, {DENSE} being SDPA with is_causal=True on every mask\n"
           f"  (its default backend, {backends}); vs flex = flex ms / {mine} ms: above 1, {mine} is faster.\n"
           f"TFLOP/s count only the pairs each mask keeps: 4·pairs·D per (batch, head) forward, "
           f"{BACKWARD_FLOPS:g}x that backward.\nerr: {mine} against flex, the largest |o| difference (forward), "
           "the worst gradient's\n  relative to its largest entry (forward + backward); - where flex did not run."]
    head = ["mask", "n", "B", "density", f"{mine} ms", "flex ms", f"{DENSE} ms", "speed-up", "vs flex",
            f"{mine} TFLOP/s", "flex TFLOP/s", "err"]
    for key in [key for key in PASSES if rows and key in rows[0]]:
        body = [[r["mask"], r["n"], r["B"], f"{r['density']:.3f}",
                 *(cell(r[key][c], "ms") for c in (mine, FLEX, DENSE)),
                 fmt(speedup(r, key, mine, DENSE), ".2f"), fmt(speedup(r, key, mine, FLEX), ".2f"),
                 *(fmt(r[key][c].get("tflops"), ".0f") for c in (mine, FLEX)), fmt(r[key][mine].get("err"), ".1e")]
                for r in rows]  # a column's note once, in its ms
        out.append(f"\n{PASSES[key]}\n" + tabulate(body, head, stralign="right", disable_numparse=True))
        out += summary(rows, key, mine)
    return "\n".join(out)


def summary(rows: list[dict], key: str, mine: str) -> list[str]:
    """Yours against FlexAttention over every cell, and the target cell's speed-up over dense causal."""
    lines = []
    ratios = [x for r in rows if (x := speedup(r, key, mine, FLEX))]
    if ratios:
        lines.append(f"{mine} vs flex, {PASSES[key]}: geometric mean {geomean(ratios):.2f}x, min {min(ratios):.2f}x, "
                     f"max {max(ratios):.2f}x over {len(ratios)} cells (above 1: {mine} is faster)")
    # Round r of flex and of yours ran one after the other: their ratio is what one timing of each says.
    by_round = [f / m for r in rows for f, m in zip(r[key][FLEX].get("rounds", ()), r[key][mine].get("rounds", ()))]
    if len(by_round) > len(ratios):
        lines.append(f"  each from the fastest of {len(by_round) // len(ratios)} rounds; "
                     f"round by round {min(by_round):.2f}x to {max(by_round):.2f}x")
    target = [x for r in rows if (r["mask"], r["n"]) == (TARGET_MASK, TARGET_N)
              and (x := speedup(r, key, mine, DENSE)) is not None]
    if target:
        lines.append(f"{mine}, {TARGET_MASK} at n = {TARGET_N}, {PASSES[key]}: {target[0]:.1f}x {DENSE} "
                     f"(reference target {TARGET_SPEEDUP:.0f}x)")
    return lines


def plot(rows: list[dict], mine: str, path: Path) -> None:
    """Speed-up over dense causal against 1 / density, a marker per mask, one panel per pass:
    yours filled, FlexAttention hollow, and the line where time follows the tiles computed."""
    plt = pyplot()
    if plt is None:
        return
    keys = [key for key in PASSES if rows and key in rows[0]]
    fig, axes = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 4.5), squeeze=False)
    markers = dict(zip(io_report.interval_masks(1), "osD^"))
    for ax, key in zip(axes[0], keys):
        for name, marker in markers.items():
            for col, color, fill in ((mine, "C0", None), (FLEX, "C1", "none")):
                pts = [(1 / r["density"], s) for r in rows if r["mask"] == name
                       and (s := speedup(r, key, col, DENSE)) is not None]
                if pts:
                    ax.plot(*zip(*pts), marker=marker, linestyle="", color=color, markerfacecolor=fill,
                            label=f"{col}, {name}")
        xs = [2.0, *(1 / r["density"] for r in rows)]  # dense causal computes about half the tiles: x = 2
        ax.plot([min(xs), max(xs)], [min(xs) / 2, max(xs) / 2], "k--", lw=0.8, label="time as tiles: 1 / (2 density)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set(xlabel="1 / density", ylabel=f"speed-up over {DENSE} (SDPA)", title=f"{PASSES[key]}, bf16, H=16, D=128")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def main(target: Path, argv: list[str]) -> int:
    args = parse(argv)
    torch = gpu_torch("python grader.py 13")
    if torch is None:
        return 2
    import triton
    table = columns(torch, target)
    mine = next(iter(table))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}; bf16, "
          f"B·n = {TOKENS}, H = {HEADS}, D = {HEAD_DIM}, blocks of {BLOCK}; target {target}", flush=True)
    rows = run_cells(torch, args, table)
    print(report(rows, mine))
    if "documents" in args.masks:
        print("documents per sequence: " + ", ".join(f"{io_report.document_ids(n)[-1] + 1} at n = {n}"
                                                     for n in dict.fromkeys(args.n)))
    if not args.no_plot:
        plot(rows, mine, args.plot)
    return 0
