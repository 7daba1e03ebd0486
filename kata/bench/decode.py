"""Time exercise 10's split-KV decoding against the GPU's copy bandwidth, SDPA and 06's kernel.

    python grader.py --bench decode [--b 1 16 64] [--n 4096 32768 131072] [--num-splits N]

Every cell decodes one token (n_q = 1) in bfloat16 with H_q = 32 query heads over H_kv = 8 kv heads,
D = 128, for batch B and a cache of n_k keys. Decoding is memory-bound, so the measure is bandwidth:
the bytes of K and V read (B·H_kv·n_k·D·2 bytes, twice) over the median time of a CUDA-graph
replay of the step (triton.testing.do_bench_cudagraph: no Python launch overhead), as a fraction of the copy bandwidth measured in the same run (a 1 GiB
device-to-device copy: bytes read + written over its time). Methods: your flash_decode (the target
folder's 10), the kata's reference solution, SDPA with enable_gqa=True (K/V repeated to 32 heads
on a torch without it; the table says which), and exercise 06's reference kernel on K/V expanded to
32 heads, since 06 has no GQA (it reads 4x the bytes; its bandwidth column counts only the 8 heads'
bytes, as for every method). Cells whose tensors do not fit in free memory are skipped with a note, as
are columns that cannot run on this GPU; any other error stops the benchmark, naming its column.
Without a CUDA device it says so and returns 2: nothing was measured.
"""
from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from kata.bench.common import fmt, guarded, gpu_torch, kernel, max_error, median_ms, repeat_kv, speedup
from kata.exercises import SOLUTIONS_DIR

H_Q, H_KV, HEAD_DIM, BYTES = 32, 8, 128, 2  # the benchmark's heads, head dimension, bfloat16
COPY_BYTES = 2**30  # large enough that the copy streams from HBM, not L2
YOURS, REFERENCE, SDPA, FA06 = "yours", "reference", "sdpa", "06 expanded"
TARGET_FRACTION, TARGET_SPEEDUP, LONG = 0.70, 3.0, 32768  # the reference's goals at B = 1, n_k >= LONG


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="grader.py --bench decode", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--b", type=int, nargs="+", default=[1, 16, 64], help="batch sizes")
    p.add_argument("--n", type=int, nargs="+", default=[4096, 32768, 131072], help="cache lengths n_k")
    p.add_argument("--num-splits", type=int, default=None, help="force num_splits (default: the kernel chooses)")
    return p.parse_args(argv)


def kv_bytes(B: int, n_k: int) -> int:
    """Bytes of K and V one decoding step must read."""
    return 2 * B * H_KV * n_k * HEAD_DIM * BYTES


def time_ms(torch, name: str, fn, expected) -> dict:
    """{'ms'} for method `name` in one cell, or {'note'} saying why there is no number.

    Timed as CUDA-graph replays, as a serving engine runs its decoding steps: one step moves tens
    of microseconds of data, about what launching two kernels from Python costs, and a graph
    replay leaves only the GPU's time. A function that cannot be captured is timed plainly.
    """
    from triton.testing import do_bench_cudagraph

    def timed():
        err = max_error(fn(), expected)
        if not err <= 0.02:  # outputs are means of thousands of unit values: bf16 rounding is far below this
            return {"note": f"wrong ({err:.2g})"}
        try:
            return {"ms": do_bench_cudagraph(fn, rep=100, return_mode="median")}
        except RuntimeError:  # not capturable (a host sync inside): fn() ran above, so this is no bug
            torch.cuda.synchronize()
            return {"ms": median_ms(fn), "graph": False}
    return guarded(torch, name, timed)


def copy_gbs(torch) -> float:
    """Device-to-device copy bandwidth, GB/s: bytes read plus bytes written over the copy's time."""
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(partial(dst.copy_, src), rep=200)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * COPY_BYTES / ms * 1e-6


def has_enable_gqa(torch) -> bool:
    """Whether this torch's SDPA takes enable_gqa (2.5 and newer); a builtin has no signature to ask."""
    tiny = torch.zeros(1, 2, 1, 16), torch.zeros(1, 1, 1, 16)
    try:
        torch.nn.functional.scaled_dot_product_attention(tiny[0], tiny[1], tiny[1], enable_gqa=True)
    except TypeError:
        return False
    return True


def sdpa_gqa(torch, q, k, v, enable_gqa: bool):
    """SDPA with grouped K/V heads: through enable_gqa where torch has it, else on K/V repeated."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return sdpa(q, k, v, enable_gqa=True) if enable_gqa else sdpa(q, *repeat_kv(q, k, v))


def methods(torch, target: Path, num_splits: int | None) -> tuple[dict, str]:
    """name -> fn(q, k, v) -> o, and how SDPA gets its GQA."""
    gqa = has_enable_gqa(torch)

    def decoder(column: str, folder: Path):
        flash_decode = kernel(column, "10", folder, "flash_decode")
        return lambda q, k, v: flash_decode(q, k, v, num_splits=num_splits)[0]

    table = {} if target.resolve() == SOLUTIONS_DIR.resolve() else {YOURS: decoder(YOURS, target)}
    table.update({REFERENCE: decoder(REFERENCE, SOLUTIONS_DIR), SDPA: partial(sdpa_gqa, torch, enable_gqa=gqa)})
    return table, "SDPA with enable_gqa=True" if gqa else "SDPA on K/V repeated to 32 heads (no enable_gqa here)"


def expanded_06():
    """06's reference kernel as a column: fn(q, k, v) -> o, K and V already repeated to q's heads
    (`repeat_kv`), since 06 has no GQA."""
    flash_attention = kernel(FA06, "06", SOLUTIONS_DIR, "flash_attention")
    return lambda q, k, v: flash_attention(q, k, v)[0]


def run_cells(torch, args, table: dict) -> list[dict]:
    fa06 = expanded_06()
    cells = [(B, n) for B in args.b for n in args.n]
    rows = []
    for number, (B, n_k) in enumerate(cells, start=1):
        row = {"B": B, "n_k": n_k, "bytes": kv_bytes(B, n_k)}
        free = torch.cuda.mem_get_info()[0]
        if 1.25 * row["bytes"] > free:  # K, V, plus SDPA's and the partials' working room
            row.update({name: {"note": "no room"} for name in [*table, FA06]})
            rows.append(row)
            print(f"[{number}/{len(cells)}] B={B} n_k={n_k}: K+V {row['bytes'] / 2**30:.0f} GiB, "
                  f"{free / 2**30:.0f} GiB free: skipped", flush=True)
            continue
        gen = torch.Generator(device="cuda").manual_seed(number)
        q = torch.randn(B, H_Q, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
        k, v = (torch.randn(B, H_KV, n_k, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
                for _ in range(2))
        try:
            expected = table[SDPA](q, k, v)
        except torch.cuda.OutOfMemoryError:  # SDPA's math backend repeats K/V: check against the reference
            torch.cuda.empty_cache()
            expected = table[REFERENCE](q, k, v)
        for name, fn in table.items():
            row[name] = time_ms(torch, name, partial(fn, q, k, v), expected)
        if 4 * row["bytes"] + row["bytes"] // 4 < torch.cuda.mem_get_info()[0]:
            k4, v4 = repeat_kv(q, k, v)
            row[FA06] = time_ms(torch, FA06, partial(fa06, q, k4, v4), expected)
            del k4, v4
        else:
            row[FA06] = {"note": "no room x4"}
        rows.append(row)
        done = ", ".join(f"{name} {_cell(row[name])}" for name in [*table, FA06])
        print(f"[{number}/{len(cells)}] B={B} n_k={n_k}: {done} ms", flush=True)
        del q, k, v, expected
        torch.cuda.empty_cache()
    return rows


def _cell(result: dict) -> str:
    # A time taken with its Python launches (not capturable in a graph) is marked: it is not comparable.
    return result.get("note") or f"{result['ms']:.3f}" + ("" if result.get("graph", True) else " launched")


def fraction(row: dict, name: str, copy: float) -> float | None:
    """Bandwidth of K and V read, as a fraction of the copy bandwidth (GB/s)."""
    return row["bytes"] / row[name]["ms"] * 1e-6 / copy if "ms" in row[name] else None


def report(rows: list[dict], names: list[str], copy: float, sdpa_note: str) -> str:
    """The three tables (ms, fraction of copy bandwidth, speed ratios) and the summary lines."""
    from tabulate import tabulate
    names = [*names, FA06]
    head = ["B", "n_k", "K+V MiB"]
    keys = lambda r: [r["B"], r["n_k"], f"{r['bytes'] / 2**20:.0f}"]  # noqa: E731
    mine = [n for n in (YOURS, REFERENCE) if n in names]
    out = [f"copy bandwidth {copy:.0f} GB/s (read + written); {SDPA}: {sdpa_note}",
           f"{FA06}: 06's reference on K/V repeated to {H_Q} heads (4x the bytes; fractions count 8 heads')"]
    body = [keys(r) + [_cell(r[n]) for n in names] for r in rows]
    out.append("\nmedian ms\n" + tabulate(body, head + names, stralign="right", disable_numparse=True))
    body = [keys(r) + [fmt(fraction(r, n, copy), ".0%") for n in names] for r in rows]
    out.append("\nK and V bytes / time, as a fraction of copy bandwidth\n"
               + tabulate(body, head + names, stralign="right", disable_numparse=True))
    pairs = [(m, b) for m in mine for b in (SDPA, FA06)]
    body = [keys(r) + [fmt(speedup(r, m, b), ".2f") for m, b in pairs] for r in rows]
    short = {YOURS: "yours", REFERENCE: "ref", SDPA: "sdpa", FA06: "06"}
    out.append("\nspeed-up, a/b = time of b / time of a (higher: a is faster)\n"
               + tabulate(body, head + [f"{short[m]}/{short[b]}" for m, b in pairs], stralign="right",
                          disable_numparse=True))
    for name in mine:
        out += summary(rows, name, copy)
    return "\n".join(out)


def summary(rows: list[dict], name: str, copy: float) -> list[str]:
    """The worst cell at B = 1, n_k >= LONG: fraction of copy bandwidth and speed-up over 06's kernel."""
    long = [r for r in rows if r["B"] == 1 and r["n_k"] >= LONG]
    fractions = [f for r in long if (f := fraction(r, name, copy)) is not None]
    speedups = [s for r in long if (s := speedup(r, name, FA06)) is not None]
    if not fractions:
        return [f"\n{name}: no cell at B = 1, n_k >= {LONG} was measured"]
    lines = [f"\n{name} at B = 1, n_k >= {LONG}: {min(fractions):.0%} of copy bandwidth "
             f"(worst of {len(fractions)} cells; reference target {TARGET_FRACTION:.0%})"]
    if speedups:
        lines.append(f"{name} at B = 1, n_k >= {LONG}: {min(speedups):.1f}x 06's kernel speed "
                     f"(worst of {len(speedups)} cells; reference target {TARGET_SPEEDUP:.0f}x)")
    return lines


def main(target: Path, argv: list[str]) -> int:
    args = parse(argv)
    torch = gpu_torch("python grader.py 10")
    if torch is None:
        return 2
    import triton
    table, sdpa_note = methods(torch, target, args.num_splits)
    copy = copy_gbs(torch)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}; bf16, "
          f"n_q = 1, H_q = {H_Q}, H_kv = {H_KV}, D = {HEAD_DIM}; copy {copy:.0f} GB/s; target {target}", flush=True)
    rows = run_cells(torch, args, table)
    print(report(rows, list(table), copy, sdpa_note))
    return 0
