"""Time exercise 06's kernel against PyTorch's attention on a CUDA GPU: a table, ratios and a plot.

    python grader.py --bench [--n 1024 4096] [--d 64 128] [--plot PATH | --no-plot]

Every cell is bfloat16 with B*N = 16384 tokens and H*D = 2048: N from 1k to 16k, D 64 and 128,
causal and not. Each method is checked against torch's SDPA once, then timed with
triton.testing.do_bench (median ms); TFLOP/s counts 4*B*H*N^2*D, halved when causal; peak memory is
torch.cuda.max_memory_allocated over one call, inputs included. Methods: your kernel (the target
folder's 06), the kata's reference solution, SDPA with PyTorch's default choice (its backend named),
SDPA forced to the flash and to the cuDNN backends, and naive attention (matmul, softmax, matmul).
Without a CUDA device it says so and returns 2: nothing was measured.
"""
from __future__ import annotations

import argparse
import math
from functools import partial
from pathlib import Path

from kata.exercises import SOLUTIONS_DIR, find, load
from kata.gpu import NO_GPU, bf16_missing, gpu_skip_reason

TOKENS, WIDTH = 16384, 2048  # B*N and H*D of every cell
NAIVE, REFERENCE, YOURS = "naive", "reference", "yours"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="grader.py --bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384], help="sequence lengths")
    p.add_argument("--d", type=int, nargs="+", default=[64, 128], help="head dimensions")
    p.add_argument("--plot", type=Path, default=Path("bench_06.png"), help="where the plot goes (needs matplotlib)")
    p.add_argument("--no-plot", dest="plot", action="store_const", const=None, help="no plot")
    return p.parse_args(argv)


def methods(torch, target: Path) -> dict:
    """name -> attention(q, k, v, causal) for every method; a missing SDPA backend fails when timed."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def forced(backend):
        def run(q, k, v, causal):
            with sdpa_kernel(backend):
                return sdpa(q, k, v, is_causal=causal)
        return run

    def naive(q, k, v, causal):
        s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        if causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).triu(1), -math.inf)
        return torch.softmax(s, dim=-1) @ v

    def ours(folder: Path):
        flash_attention = load(find("06"), folder).flash_attention
        return lambda q, k, v, causal: flash_attention(q, k, v, causal=causal)[0]

    table = {} if target.resolve() == SOLUTIONS_DIR.resolve() else {YOURS: ours(target)}
    table.update({REFERENCE: ours(SOLUTIONS_DIR), "sdpa default": lambda q, k, v, causal: sdpa(q, k, v, is_causal=causal),
                  "sdpa flash": forced(SDPBackend.FLASH_ATTENTION), "sdpa cudnn": forced(SDPBackend.CUDNN_ATTENTION),
                  NAIVE: naive})
    return table


def default_backend(torch, q, k, v, causal: bool) -> str:
    """The backend SDPA picks for these inputs, as PyTorch's dispatcher reports it."""
    from torch.nn.attention import SDPBackend
    try:
        return SDPBackend(torch._fused_sdp_choice(q, k, v, None, 0.0, causal)).name.lower()
    except Exception:  # a private API: name it unknown rather than fail the benchmark
        return "unknown"


def measure(torch, fn, expected, flops: float) -> dict:
    """{'ms', 'tflops', 'mib'} for one method in one cell, or {'note'} saying why there is no number."""
    from triton.testing import do_bench
    try:
        out = fn()
        err = (out.float() - expected.float()).abs().max().item()
        if not err <= 0.05:  # bf16 outputs of magnitude < 1: a bigger gap is a wrong answer, not rounding
            return {"note": f"wrong ({err:.2g})"}
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        mib = torch.cuda.max_memory_allocated() / 2**20
        ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
        return {"ms": ms, "tflops": flops / ms * 1e-9, "mib": mib}
    except torch.cuda.OutOfMemoryError:
        return {"note": "OOM"}
    except Exception as err:  # the learner's kernel unfinished or broken, a backend missing
        text = str(err)
        return {"note": "not started" if "NotImplementedError" in f"{type(err).__name__} {text}"
                else text.strip().splitlines()[-1][:60] if text.strip() else type(err).__name__}
    finally:
        torch.cuda.empty_cache()


def run_cells(torch, args, table: dict) -> list[dict]:
    cells = [(d, causal, n) for d in args.d for causal in (False, True) for n in args.n]
    rows = []
    for number, (d, causal, n) in enumerate(cells, start=1):
        B, H = max(1, TOKENS // n), WIDTH // d
        gen = torch.Generator(device="cuda").manual_seed(number)
        q, k, v = (torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
        flops = 4 * B * H * n * n * d / (2 if causal else 1)
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        row = {"D": d, "causal": causal, "N": n, "B": B, "H": H,
               "default is": default_backend(torch, q, k, v, causal)}
        for name, fn in table.items():
            row[name] = measure(torch, partial(fn, q, k, v, causal), expected, flops)
        rows.append(row)
        done = ", ".join(f"{name} {_cell(row[name], 'ms')}" for name in table)
        print(f"[{number}/{len(cells)}] D={d} {'causal' if causal else 'full'} N={n} B={B} H={H}: {done} ms",
              flush=True)
        del q, k, v, expected
    return rows


def _cell(result: dict, key: str) -> str:
    return result.get("note") or f"{result[key]:.{3 if key == 'ms' else 0}f}"


def _ratio(rows, a: str, b: str) -> list[float | None]:
    """Speed of a over b per cell: time of b / time of a."""
    return [row[b]["ms"] / row[a]["ms"] if "ms" in row[a] and "ms" in row[b] else None for row in rows]


def report(rows: list[dict], names: list[str]) -> str:
    from tabulate import tabulate
    keys = lambda r: [r["D"], "causal" if r["causal"] else "full", r["N"], f"{r['B']}x{r['H']}"]  # noqa: E731
    head = ["D", "mask", "N", "BxH"]
    out = []
    for title, key in (("median ms", "ms"), ("TFLOP/s", "tflops"), ("peak memory, MiB", "mib")):
        body = [keys(r) + [_cell(r[n], key) for n in names] for r in rows]
        out.append(f"\n{title}\n" + tabulate(body, head + names, stralign="right", disable_numparse=True))
    # B*N is the same in every cell, so the totals above hide how memory grows with N; per sequence
    # it shows: linear in N for a fused kernel, N^2 for naive attention's scores.
    body = [keys(r) + [r[n].get("note") or f"{r[n]['mib'] / r['B']:.1f}" for n in names] for r in rows]
    out.append("\npeak memory per sequence, MiB (peak / B): linear in N when fused, N^2 when naive\n"
               + tabulate(body, head + names, stralign="right", disable_numparse=True))
    mine = [n for n in (YOURS, REFERENCE) if n in names]
    pairs = [(m, b) for m in mine for b in ("sdpa flash", "sdpa default")]
    body = [keys(r) + [r["default is"]] + [_fmt(_ratio([r], m, b)[0]) for m, b in pairs] for r in rows]
    ratio_head = head + ["default is"] + [f"{m} / {b.removeprefix('sdpa ')}" for m, b in pairs]
    out.append("\nspeed ratio (higher is faster)\n" + tabulate(body, ratio_head, stralign="right", disable_numparse=True))
    for m, b in pairs:
        ratios = [x for x in _ratio(rows, m, b) if x]
        if ratios:
            geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
            out.append(f"{m} vs {b}: geometric mean {geo:.2f}x, min {min(ratios):.2f}x, max {max(ratios):.2f}x "
                       f"over {len(ratios)} cells")
    return "\n".join(out)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def plot(rows: list[dict], names: list[str], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no plot: matplotlib is not installed)")
        return
    panels = sorted({(r["D"], r["causal"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4), squeeze=False)
    for ax, (d, causal) in zip(axes[0], panels):
        mine = [r for r in rows if (r["D"], r["causal"]) == (d, causal)]
        for name in names:
            pts = [(r["N"], r[name]["tflops"]) for r in mine if "tflops" in r[name]]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set(xlabel="N (tokens per sequence)", ylabel="TFLOP/s",
               title=f"D={d}, {'causal' if causal else 'full'}, bf16")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def main(target: Path, argv: list[str]) -> int:
    args = parse(argv)
    try:
        import torch
        import triton
    except ImportError as err:
        print(f"The benchmark needs torch and Triton ({err}); nothing was measured.")
        return 2
    if not torch.cuda.is_available():
        why = gpu_skip_reason(torch)
        print("The benchmark needs a CUDA GPU, and none is usable here; nothing was measured.\n"
              + ("" if why == NO_GPU else why + "\n")
              + "Your kernel's correctness is still tested on the CPU: python grader.py 06")
        return 2
    if why := bf16_missing(torch):
        print(f"Every cell of the benchmark is bfloat16, so all are skipped: {why}. Nothing was measured.")
        return 2
    table = methods(torch, target)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}; "
          f"bf16, B*N = {TOKENS}, H*D = {WIDTH}; target {target}", flush=True)
    rows = run_cells(torch, args, table)
    print(report(rows, list(table)))
    if args.plot is not None:
        plot(rows, list(table), args.plot)
    return 0
