"""`python grader.py --bench train`: exercise 15's GPT trained with three attention layers, n from 1k to 64k.

    python grader.py --bench train [--n 1024 2048 ... 65536] [--tokens T] [--steps S] [--warmup W]
                                   [--dropout P] [--accuracy-steps A] [--plot PATH] [--no-plot]

Every cell trains the model that `python grader.py train` trains on a GPU (kata/tools/train.py's GPU
sizes, attention dropout P = 0.1, GPT-2's) on rows of the needle task, B·n = T tokens a step (B = T
// n), bf16 autocast (the q, k, v product in float32: kata/given/gpt.py's Float32Linear), AdamW: W
steps of warm-up (the kernels compile), then S timed steps. The attention layer is, in turn:
standard attention written in PyTorch (the n × n scores and probabilities in HBM, dropout a pass of
its own), SDPA (PyTorch's dispatch, which picks its fastest backend for these inputs) and exercise
15's layer in the target folder, on your 14 once it passes, as `python grader.py train` runs it. The
table gives tokens per second, the peak memory of the timed steps (torch.cuda.max_memory_allocated:
weights, AdamW's state and the activations) and the ratios against standard attention and SDPA; a
method that runs out of memory gets "OOM" in its cell and the benchmark goes on. Then, at each n
where exercise 15's layer fits, the long-range task's accuracy (kata/given/needle.py, chance 1/8) of
the model trained A steps with that layer by the training loop of `python grader.py train`
(kata/given/train.py), B rows a step, under the same autocast, on the answers' loss alone
(needle.answers_only: on every token's, the filler drowns the answer at long n), and scored on
held-out rows. A fixed budget of steps, not training to the end: at B·n fixed the long contexts see
few rows a step, and may stay at chance in A steps; `python grader.py train --context n --steps ...`
trains one n for longer.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Callable

import numpy as np

from kata.bench.common import default_backend, fmt, from_exercise, gpu_torch, guarded, pyplot, standard_attention
from kata.exercises import is_solutions
from kata.given import needle
from kata.tools.train import EVAL_ROWS, GPU, kernels_line, run_on_your_kernels

TOKENS = 65536  # B·n of every cell
SIZES = [1024 * 2**i for i in range(7)]  # 1k .. 64k
STEPS, WARMUP = 5, 2
ACCURACY_STEPS = 300
DROPOUT, LR = 0.1, 3e-3
STANDARD, SDPA, YOURS, REFERENCE = "standard", "sdpa", "yours", "reference"
# The paper's claims, as goals for the reference: 2-4x standard attention's training speed (the lower
# end from 4k on, where the n × n passes dominate), no slower than SDPA.
GOAL_FROM_N, GOAL_VS_STANDARD, GOAL_VS_SDPA = 4096, 2.0, 1.0


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="grader.py --bench train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=SIZES, help="context lengths")
    p.add_argument("--tokens", type=int, default=TOKENS, help="B·n, the tokens of every step (default %(default)s)")
    p.add_argument("--steps", type=int, default=STEPS, help="timed steps a cell (default %(default)s)")
    p.add_argument("--warmup", type=int, default=WARMUP, help="untimed steps first (default %(default)s)")
    p.add_argument("--dropout", type=float, default=DROPOUT,
                   help="attention dropout, every method's (default %(default)s, GPT-2's; 0: no mask drawn)")
    p.add_argument("--accuracy-steps", type=int, default=ACCURACY_STEPS,
                   help="training steps before the accuracy at each n (0: no accuracy; default %(default)s)")
    p.add_argument("--plot", type=Path, default=Path("bench_train.png"), help="where the plot goes (needs matplotlib)")
    p.add_argument("--no-plot", action="store_true", help="no plot")
    args = p.parse_args(argv)
    if min(*args.n, args.tokens, args.steps) < 1 or min(args.warmup, args.accuracy_steps) < 0:
        p.error("sizes and --steps must be positive, --warmup and --accuracy-steps at least 0")
    if not 0 <= args.dropout < 1:
        p.error("--dropout must lie in [0, 1)")
    return args


def torch_layer(attend):
    """An attention layer of the model (kata/given/gpt.py) that runs attend(q, k, v, dropout_p) -> y on
    q, k, v of shape (B, n_head, T, D), causal: the baselines' layers, shaped as exercise 15's."""
    from kata.given.gpt import AttentionParameters

    class Layer(AttentionParameters):
        def forward(self, x, doc_ids=None, seed=0):
            B, T, C = x.shape
            q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
            y = attend(q, k, v, self.dropout if self.training else 0.0)
            return self.proj(y.transpose(1, 2).reshape(B, T, C))
    return Layer


def methods(torch, target: Path) -> dict:
    """name -> attention layer class: standard, SDPA, and 15's (yours, or the reference for solutions/)."""
    import torch.nn.functional as F
    mine = REFERENCE if is_solutions(target) else YOURS
    return {STANDARD: torch_layer(lambda q, k, v, p: standard_attention(torch, q, k, v, causal=True, dropout_p=p)),
            SDPA: torch_layer(lambda q, k, v, p: F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)),
            mine: from_exercise(mine, "15", target, "CausalSelfAttention")[0]}


def train_cell(torch, attention, n: int, B: int, size: dict, steps: int, warmup: int, device: str, dtype,
               clock=time.perf_counter) -> dict:
    """{'tokens_s', 'mib', 'loss'}: the model of `size` (layers, heads, embd) with this attention layer,
    trained `warmup` steps, then `steps` steps timed by clock() (seconds) on B rows of n tokens; mib:
    the timed steps' peak CUDA memory (None off CUDA); loss: the last step's."""
    from kata.given.train import optimizer
    cuda = device.startswith("cuda")
    model = new_model(torch, attention, n, size, device)
    opt = optimizer(model, LR)
    data = needle.as_batch(needle.rows(np.random.default_rng(n), B, n).to(device))

    def step(seed: int):
        with torch.autocast(device.split(":")[0], dtype=dtype, enabled=dtype != torch.float32):
            _, loss = model(data.tokens, data.targets, seed=seed)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    def sync():
        if cuda:
            torch.cuda.synchronize()

    for seed in range(warmup):
        step(seed)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = clock()
    for seed in range(warmup, warmup + steps):
        loss = step(seed)
    sync()
    seconds = clock() - start
    return {"tokens_s": B * n * steps / seconds, "loss": loss.item(),
            "mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None}


def new_model(torch, attention, n: int, size: dict, device: str):
    """The model of `size` (layers, heads, embd, dropout) at context n with this attention layer, seeded."""
    from kata.given.gpt import GPT, GPTConfig
    torch.manual_seed(0)
    return GPT(GPTConfig(needle.VOCAB, n, size["layers"], size["heads"], size["embd"], size["dropout"]),
               attention).to(device)


def accuracy_cell(torch, attention, n: int, B: int, size: dict, steps: int, device: str, dtype) -> dict:
    """{'accuracy', 'loss'}: the model trained `steps` steps by kata/given/train.py's loop on fresh
    needle rows, B a step, under `dtype` autocast, on the answers' loss alone; then its accuracy on
    EVAL_ROWS held-out rows."""
    from kata.given.train import train
    model = new_model(torch, attention, n, size, device)
    data = np.random.default_rng(n)
    held_out = needle.rows(np.random.default_rng(n + 1), EVAL_ROWS, n).to(device)
    with torch.autocast(device.split(":")[0], dtype=dtype, enabled=dtype != torch.float32):
        last = train(model, lambda step: needle.answers_only(needle.as_batch(needle.rows(data, B, n).to(device))),
                     steps, LR, steps, lambda progress: None, lambda m: needle.accuracy(m, held_out, B))
    return {"accuracy": last.accuracy, "loss": last.loss}


def run_accuracy(torch, rows: list[dict], name: str, layer, size: dict, steps: int, device: str = "cuda",
                 dtype=None, say=print) -> None:
    """Adds row['accuracy'] (accuracy_cell's numbers, or {'note'}) to each row where `name` trained."""
    dtype = dtype or torch.bfloat16
    for row in rows:
        if "tokens_s" not in row[name]:
            row["accuracy"] = {"note": "-"}
            continue
        row["accuracy"] = guarded(torch, name, lambda: accuracy_cell(torch, layer, row["n"], row["B"], size, steps,
                                                                     device, dtype))
        say(f"n={row['n']}: {name} trained {steps} steps, accuracy {cell(row['accuracy'], 'accuracy', '.1%')}",
            flush=True)


def run_cells(torch, layers: dict, sizes: list[int], tokens: int, size: dict, steps: int, warmup: int,
              device: str = "cuda", dtype=None, clock=time.perf_counter, say=print) -> list[dict]:
    """One row per n: {'n', 'B', 'backend', name: train_cell's numbers or {'note'}} for each layer of
    `layers` (name -> class); a method out of memory gets {'note': 'OOM'} and the next cell runs."""
    dtype = dtype or torch.bfloat16
    rows = []
    for n in dict.fromkeys(sizes):
        B = max(1, tokens // n)
        backend = "-"
        if device.startswith("cuda"):  # what SDPA's dispatch picks for one layer's q, k, v
            probe = torch.empty(B, size["heads"], n, size["embd"] // size["heads"], device=device, dtype=dtype)
            backend = default_backend(torch, probe, probe, probe, True)
            del probe
        row = {"n": n, "B": B, "backend": backend}
        for name, layer in layers.items():
            row[name] = guarded(torch, name, lambda layer=layer: train_cell(
                torch, layer, n, B, size, steps, warmup, device, dtype, clock))
        rows.append(row)
        say(f"n={n} B={B}: " + ", ".join(f"{name} {cell(row[name], 'tokens_s', ',.0f')} tokens/s" for name in layers),
            flush=True)
    return rows


def cell(result: dict, key: str, spec: str) -> str:
    """A method's `key` in one cell, or its note (OOM, not started)."""
    return result.get("note") or fmt(result.get(key), spec)


def speedup(row: dict, fast: str, slow: str) -> float | None:
    """tokens/s of `fast` over those of `slow` in one row; None where either has none."""
    a, b = row[fast].get("tokens_s"), row[slow].get("tokens_s")
    return a / b if a and b else None


def report(rows: list[dict], names: list[str], mine: str) -> str:
    """The table (tokens/s, peak MiB, the ratios of `mine` over standard and SDPA, and its accuracy
    where run_accuracy ran) and the goal lines."""
    from tabulate import tabulate
    backends = ", ".join(sorted({r["backend"] for r in rows}))
    accuracy = any("accuracy" in r for r in rows)
    head = ["n", "B", *(f"{name}\ntokens/s" for name in names), *(f"{name}\npeak MiB" for name in names),
            f"vs\n{STANDARD}", f"vs\n{SDPA}", *([f"{mine}\naccuracy"] if accuracy else [])]
    body = [[r["n"], r["B"], *(cell(r[name], "tokens_s", ",.0f") for name in names),
             *(cell(r[name], "mib", ".0f") for name in names),
             fmt(speedup(r, mine, STANDARD), ".2f"), fmt(speedup(r, mine, SDPA), ".2f"),
             *([cell(r.get("accuracy", {}), "accuracy", ".1%")] if accuracy else [])] for r in rows]
    return "\n".join([f"vs {STANDARD}, vs {SDPA}: {mine}'s tokens/s over theirs (above 1: {mine} is faster);\n"
                      f"{SDPA}: PyTorch's dispatch, here {backends}; peak MiB: torch.cuda.max_memory_allocated.",
                      tabulate(body, head, stralign="right", disable_numparse=True), *summary(rows, mine)])


def summary(rows: list[dict], mine: str) -> list[str]:
    """The paper's claims for `mine`: its speed-ups against their goals, its peak memory across n (B·n
    fixed: flat means linear in n per row), and the contexts standard attention cannot fit."""
    lines = []
    for slow, goal, start in ((STANDARD, GOAL_VS_STANDARD, GOAL_FROM_N), (SDPA, GOAL_VS_SDPA, 0)):
        ratios = [(x, r["n"]) for r in rows if r["n"] >= start and (x := speedup(r, mine, slow)) is not None]
        if ratios:
            worst, at = min(ratios)
            lines.append(f"{mine} vs {slow}" + (f" from n = {start}" if start else "") + f": at least {worst:.2f}x "
                         f"(at n = {at}; goal {goal:.1f}x): " + ("met" if worst >= goal else "missed"))
    mib = [(r[mine]["mib"], r["n"]) for r in rows if r[mine].get("mib") is not None]
    if len(mib) > 1:
        lines.append(f"{mine}'s peak memory: {min(mib)[0]:,.0f} to {max(mib)[0]:,.0f} MiB over n = {mib[0][1]} to "
                     f"{mib[-1][1]} ({max(mib)[0] / min(mib)[0]:.2f}x; flat: linear in n)")
    beyond = [r for r in rows if r[STANDARD].get("note") == "OOM" and "tokens_s" in r[mine]]
    if beyond:
        lines.append(f"standard attention runs out of memory at n = {', '.join(str(r['n']) for r in beyond)}; "
                     f"{mine} trains there")
        reached = [f"{r['accuracy']['accuracy']:.1%} at {r['n']}" for r in beyond
                   if "accuracy" in r.get("accuracy", {})]
        if reached:
            lines.append(f"{mine}'s long-range accuracy there: {', '.join(reached)} (chance {needle.CHANCE:.1%})")
    return lines


def plot(rows: list[dict], names: list[str], path: Path) -> None:
    """Tokens/s and peak memory against n, one line per method, and the accuracy where measured; an
    OOM cell has no point."""
    plt = pyplot()
    if plt is None:
        return
    panels = [("tokens_s", "tokens/s", names), ("mib", "peak memory, MiB", names)]
    if any("accuracy" in r for r in rows):
        panels.append(("accuracy", "long-range accuracy", ["accuracy"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5))
    for ax, (key, label, lines) in zip(axes, panels):
        for name in lines:
            pts = [(r["n"], r[name][key]) for r in rows if r.get(name, {}).get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        if key == "accuracy":
            ax.axhline(needle.CHANCE, color="gray", linestyle="--", label="chance")
            ax.legend()
        ax.set_xscale("log", base=2)
        ax.set(xlabel="n (B·n fixed)", ylabel=label, title=f"GPT training, {label}")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def main(target: Path, argv: list[str], passes: Callable[[str], bool] = lambda number: False) -> int:
    """passes(number): whether the learner's exercise `number` passes its tests (15 runs on its kernel then)."""
    args = parse(argv)
    torch = gpu_torch("python grader.py 15")
    if torch is None:
        return 2
    import triton
    yours = run_on_your_kernels(target, passes, pack=False)
    layers = methods(torch, target)
    names = list(layers)
    size = dict({key: GPU[key] for key in ("layers", "heads", "embd")}, dropout=args.dropout)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}; bf16 autocast, "
          f"B·n = {args.tokens}, {size['layers']} layers, {size['heads']} heads, width {size['embd']}, dropout "
          f"{args.dropout}; {args.warmup} + {args.steps} steps a cell; target {target}\n"
          f"{kernels_line(target, yours, pack=False)}", flush=True)
    rows = run_cells(torch, layers, args.n, args.tokens, size, args.steps, args.warmup)
    if args.accuracy_steps:
        run_accuracy(torch, rows, names[-1], layers[names[-1]], size, args.accuracy_steps)
    print(report(rows, names, names[-1]))
    if not args.no_plot:
        plot(rows, names, args.plot)
    return 0
