"""Time the kata's Triton kernels against PyTorch's attention on a CUDA GPU: tables, ratios, plots.

    python grader.py --bench [--n 1024 4096] [--d 64 128] [--pass forward|backward|both] [--no-plot]

Every cell is bfloat16 with B*N = 16384 tokens and H*D = 2048: N from 1k to 16k, D 64 and 128,
causal and not. Each method is checked against torch's SDPA once, then timed with
triton.testing.do_bench (median ms); TFLOP/s counts 4*B*H*N^2*D for the forward, halved when causal,
and 2.5 times that for the backward (its five matmuls to the forward's two); peak memory is
torch.cuda.max_memory_allocated over one call, inputs included. Methods: your kernel (the target
folder's 06, and 09 for the backward), the kata's reference solution, SDPA with PyTorch's default
choice (its backend named), SDPA forced to the flash and to the cuDNN backends, and naive
attention (matmul, softmax, matmul). A column that cannot run on this GPU (no such SDPA backend, out of
memory) or is not started gets a note in the tables; any other error stops the benchmark, naming its
column. Without a CUDA device it says so and returns 2.
"""
from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from kata.bench.common import (BACKWARD_FLOPS, cell, default_backend, geomean, gpu_torch, gradients, kernel, measure,
                               measure_training, pyplot, speedup, standard_attention)
from kata.exercises import SOLUTIONS_DIR

TOKENS, WIDTH = 16384, 2048  # B*N and H*D of every cell
NAIVE, REFERENCE, YOURS = "naive", "reference", "yours"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="grader.py --bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384], help="sequence lengths")
    p.add_argument("--d", type=int, nargs="+", default=[64, 128], help="head dimensions")
    p.add_argument("--pass", dest="passes", choices=["forward", "backward", "both"], default="both",
                   help="time the forward (06), forward + backward (09), or both")
    p.add_argument("--plot", type=Path, default=Path("bench_06.png"), help="where the plot goes (needs matplotlib)")
    p.add_argument("--plot-backward", type=Path, default=Path("bench_09.png"), help="the backward's plot")
    p.add_argument("--no-plot", action="store_true", help="no plots")
    return p.parse_args(argv)


def methods(torch, target: Path, exercise: str = "06") -> dict:
    """name -> attention(q, k, v, causal) -> o for every method, differentiable (the kata's from
    `exercise`: 06 forward only, 09 with its backward); a missing SDPA backend fails when called."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def forced(backend):
        def run(q, k, v, causal):
            with sdpa_kernel(backend):
                return sdpa(q, k, v, is_causal=causal)
        return run

    def ours(column: str, folder: Path):
        flash_attention = kernel(column, exercise, folder, "flash_attention")
        if exercise == "06":  # 06 returns (o, lse)
            return lambda q, k, v, causal: flash_attention(q, k, v, causal=causal)[0]
        return lambda q, k, v, causal: flash_attention(q, k, v, causal=causal)

    table = {} if target.resolve() == SOLUTIONS_DIR.resolve() else {YOURS: ours(YOURS, target)}
    table.update({REFERENCE: ours(REFERENCE, SOLUTIONS_DIR), "sdpa default": lambda q, k, v, causal: sdpa(q, k, v, is_causal=causal),
                  "sdpa flash": forced(SDPBackend.FLASH_ATTENTION), "sdpa cudnn": forced(SDPBackend.CUDNN_ATTENTION),
                  NAIVE: partial(standard_attention, torch)})
    return table


def cells(torch, args):
    """(number, row, q, k, v, flops) for every cell of the grid; row holds the cell's description."""
    grid = [(d, causal, n) for d in args.d for causal in (False, True) for n in args.n]
    for number, (d, causal, n) in enumerate(grid, start=1):
        B, H = max(1, TOKENS // n), WIDTH // d
        gen = torch.Generator(device="cuda").manual_seed(number)
        q, k, v = (torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
        flops = 4 * B * H * n * n * d / (2 if causal else 1)
        row = {"D": d, "causal": causal, "N": n, "B": B, "H": H,
               "default is": default_backend(torch, q, k, v, causal)}
        yield f"[{number}/{len(grid)}] D={d} {'causal' if causal else 'full'} N={n} B={B} H={H}", row, q, k, v, flops


def run_cells(torch, args, table: dict) -> list[dict]:
    rows = []
    for label, row, q, k, v, flops in cells(torch, args):
        causal = row["causal"]
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        for name, fn in table.items():
            row[name] = measure(torch, name, partial(fn, q, k, v, causal), expected, flops)
        rows.append(row)
        print(f"{label}: " + ", ".join(f"{name} {cell(row[name], 'ms')}" for name in table) + " ms", flush=True)
    return rows


def run_training_cells(torch, args, table: dict) -> list[dict]:
    rows = []
    for label, row, q, k, v, flops in cells(torch, args):
        causal = row["causal"]
        do = torch.randn_like(q)
        expected = gradients(partial(torch.nn.functional.scaled_dot_product_attention, is_causal=causal), q, k, v, do)
        for name, fn in table.items():
            row[name] = measure_training(torch, name, lambda *t, fn=fn: fn(*t, causal), q, k, v, do, expected,
                                         flops)
        rows.append(row)
        print(f"{label}: backward " + ", ".join(f"{name} {cell(row[name], 'bwd_ms')}" for name in table) + " ms",
              flush=True)
    return rows


def _ratio(rows, a: str, b: str, key: str = "ms") -> list[float | None]:
    """Speed of a over b per cell: time of b / time of a."""
    return [speedup(row, a, b, key) for row in rows]


def _keys(r: dict) -> list:
    return [r["D"], "causal" if r["causal"] else "full", r["N"], f"{r['B']}x{r['H']}"]


HEAD = ["D", "mask", "N", "BxH"]


def _ratios(rows: list[dict], names: list[str], key: str, title: str, what: str = "") -> list[str]:
    """The ratio table of the kata's kernels to SDPA's flash and default, and each pair's geometric mean."""
    from tabulate import tabulate
    mine = [n for n in (YOURS, REFERENCE) if n in names]
    pairs = [(m, b) for m in mine for b in ("sdpa flash", "sdpa default")]
    body = [_keys(r) + [r["default is"]] + [_fmt(_ratio([r], m, b, key)[0]) for m, b in pairs] for r in rows]
    ratio_head = HEAD + ["default is"] + [f"{m} / {b.removeprefix('sdpa ')}" for m, b in pairs]
    out = [f"\n{title}\n" + tabulate(body, ratio_head, stralign="right", disable_numparse=True)]
    cudnn = [(m, "sdpa cudnn") for m in mine if "sdpa cudnn" in names]  # the fastest: in the summary only
    for m, b in pairs + cudnn:
        ratios = [x for x in _ratio(rows, m, b, key) if x]
        if ratios:
            out.append(f"{m} vs {b}{what}: geometric mean {geomean(ratios):.2f}x, min {min(ratios):.2f}x, "
                       f"max {max(ratios):.2f}x over {len(ratios)} cells")
    return out


def report(rows: list[dict], names: list[str]) -> str:
    from tabulate import tabulate
    out = []
    for title, key in (("median ms", "ms"), ("TFLOP/s", "tflops"), ("peak memory, MiB", "mib")):
        body = [_keys(r) + [cell(r[n], key) for n in names] for r in rows]
        out.append(f"\n{title}\n" + tabulate(body, HEAD + names, stralign="right", disable_numparse=True))
    # B*N is the same in every cell, so the totals above hide how memory grows with N; per sequence
    # it shows: linear in N for a fused kernel, N^2 for naive attention's scores.
    body = [_keys(r) + [r[n].get("note") or f"{r[n]['mib'] / r['B']:.1f}" for n in names] for r in rows]
    out.append("\npeak memory per sequence, MiB (peak / B): linear in N when fused, N^2 when naive\n"
               + tabulate(body, HEAD + names, stralign="right", disable_numparse=True))
    out += _ratios(rows, names, "ms", "speed ratio (higher is faster)")
    return "\n".join(out)


def training_report(rows: list[dict], names: list[str]) -> str:
    """The forward + backward tables: the backward alone, then a whole training step."""
    from tabulate import tabulate
    out = ["\nFORWARD + BACKWARD (yours and reference: exercise 09); TFLOP/s count the backward as "
           f"{BACKWARD_FLOPS:g}x the forward"]
    for title, key in (("backward, median ms", "bwd_ms"), ("backward, TFLOP/s", "bwd_tflops"),
                       ("forward + backward, median ms", "ms"), ("forward + backward, TFLOP/s", "tflops"),
                       ("forward + backward, peak memory, MiB", "mib")):
        body = [_keys(r) + [cell(r[n], key) for n in names] for r in rows]
        out.append(f"\n{title}\n" + tabulate(body, HEAD + names, stralign="right", disable_numparse=True))
    out += _ratios(rows, names, "bwd_ms", "backward speed ratio (higher is faster)", ", backward")
    out += _ratios(rows, names, "ms", "forward + backward speed ratio (higher is faster)", ", forward + backward")
    return "\n".join(out)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def plot(rows: list[dict], names: list[str], path: Path, key: str = "tflops", what: str = "") -> None:
    plt = pyplot()
    if plt is None:
        return
    panels = sorted({(r["D"], r["causal"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4), squeeze=False)
    for ax, (d, causal) in zip(axes[0], panels):
        mine = [r for r in rows if (r["D"], r["causal"]) == (d, causal)]
        for name in names:
            pts = [(r["N"], r[name][key]) for r in mine if key in r[name]]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set(xlabel="N (tokens per sequence)", ylabel=f"{what}TFLOP/s",
               title=f"D={d}, {'causal' if causal else 'full'}, bf16")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def main(target: Path, argv: list[str]) -> int:
    args = parse(argv)
    torch = gpu_torch("python grader.py 06 (or 09)")
    if torch is None:
        return 2
    import triton
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}; "
          f"bf16, B*N = {TOKENS}, H*D = {WIDTH}; target {target}", flush=True)
    if args.passes in ("forward", "both"):
        table = methods(torch, target)
        rows = run_cells(torch, args, table)
        print(report(rows, list(table)))
        if not args.no_plot:
            plot(rows, list(table), args.plot)
    if args.passes in ("backward", "both"):
        table = methods(torch, target, "09")
        rows = run_training_cells(torch, args, table)
        print(training_report(rows, list(table)))
        if not args.no_plot:
            plot(rows, list(table), args.plot_backward, "bwd_tflops", "backward ")
    return 0
