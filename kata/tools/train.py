"""`python grader.py train [flags]`: train exercise 15's GPT with your attention layer and packing.

On the CPU (Triton's interpreter) a small model at a short context, about four minutes on two cores;
on a GPU a larger one at a long context. Progress every --every steps: the step, the training loss, tokens per second
and the long-range task's accuracy (kata/given/needle.py: the needle, anywhere in the row, recalled
at its end; chance 1/8). Ctrl-C stops between steps and says where.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

import numpy as np

from kata.exercises import find, is_solutions, load
from kata.given import needle
from kata.given.solved import run_on_yours

EXERCISE = "15"
# The kernels a run trains on, by --pack, and what for: 15's layer runs 14's on rows (the accuracy's
# rows too) and 13's on packed rows.
USES = {False: {"14": ""}, True: {"13": "packed rows on ", "14": "the accuracy's rows on "}}
# Both train on the answers' loss (kata/given/needle.py's answers_only): on every token's, the filler's drowns
# the answer, at long contexts for good and at the CPU's 32 tokens for 300 to 400 steps. The CPU's model, torch's
# attention in place of the kernels, reaches 98-100% at step 100 over four seeds (not at 8 rows a step: 39-98%);
# with the kernels, in the interpreter, 100% at step 90, 4 minutes in all on two cores (2.4 s a step).
CPU = dict(context=32, batch=16, layers=1, heads=2, embd=64, steps=100, lr=1e-2, every=10)
# This model on the CPU, torch's attention, at 1024 tokens and 8 rows a step: 48% at step 200, 78% at 275. On an
# H100, with the kernels at 4096 tokens: 100% from step 600 of 2000.
GPU = dict(context=4096, batch=8, layers=4, heads=4, embd=128, steps=2000, lr=3e-3, every=100)
EVAL_ROWS = 64  # rows of the held-out set the accuracy is measured on


def parse(argv: list[str], defaults: dict, where: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="grader.py train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, help_text in (("context", "tokens a row"), ("batch", "rows a step (--pack: documents a step)"),
                            ("layers", "blocks"), ("heads", "attention heads"), ("embd", "the model's width"),
                            ("steps", "training steps"), ("every", "steps between progress lines")):
        p.add_argument(f"--{name}", type=int, default=defaults[name], help=f"{help_text} (default on {where}: %(default)s)")
    p.add_argument("--lr", type=float, default=defaults["lr"], help="AdamW's peak learning rate (default %(default)s)")
    p.add_argument("--dropout", type=float, default=None,
                   help="attention dropout, in 14's kernel (default 0.1; 0 with --pack)")
    p.add_argument("--pack", action="store_true", help="documents of context/2 to context tokens, packed in one "
                   "row a step under 13's document mask (no dropout: 13's kernel has none)")
    p.add_argument("--loss", choices=["answers", "all"], default="answers",
                   help="train on the answers' targets alone or on every token's (default %(default)s: every "
                   "token's drowns the answers)")
    p.add_argument("--seed", type=int, default=0, help="the initialisation's and the data's (default 0)")
    args = p.parse_args(argv)
    if min(args.context, args.batch, args.layers, args.heads, args.embd, args.steps, args.every) < 1 or args.lr <= 0:
        p.error("sizes, steps, --every and --lr must be positive")
    if args.context < 8:
        p.error("--context must be at least 8: a document holds filler, a needle, the question and its answer")
    if args.dropout is None:
        args.dropout = 0.0 if args.pack else 0.1
    if args.pack and args.dropout:
        p.error("--pack trains without dropout: 13's kernel has none")
    return args


def main(target: Path, argv: list[str], passes: Callable[[str], bool] = lambda number: False) -> int:
    """passes(number): whether exercise `number`'s file in `target` passes its tests; 15 runs on the
    kernels of those that pass, and on the reference's for the rest."""
    from kata.gpu import triton_missing, use_triton_mode
    if missing := triton_missing():
        print(f"Training runs exercise {EXERCISE}'s layer on Triton kernels: {missing}.", file=sys.stderr)
        return 2
    import torch

    interpreted = use_triton_mode(torch).interpreted  # before Triton loads
    where = "the CPU" if interpreted else "a GPU"
    args = parse(argv, CPU if interpreted else GPU, where)
    from kata.given.gpt import GPT, GPTConfig
    from kata.given.train import train
    exercise = find(EXERCISE)
    yours = run_on_your_kernels(target, passes, args.pack)
    ex = load(exercise, target)
    device = "cpu" if interpreted else "cuda"
    torch.manual_seed(args.seed)
    config = GPTConfig(needle.VOCAB, args.context, args.layers, args.heads, args.embd, args.dropout)
    model = GPT(config, ex.CausalSelfAttention).to(device)
    data = np.random.default_rng(args.seed)
    held_out = needle.rows(np.random.default_rng(args.seed + 1), EVAL_ROWS, args.context).to(device)

    def batch(step):
        if args.pack:
            made = ex.pack([d.to(device) for d in needle.documents(data, args.batch, args.context // 2, args.context)])
        else:
            made = needle.as_batch(needle.rows(data, args.batch, args.context).to(device))
        return needle.answers_only(made) if args.loss == "answers" else made

    def evaluate(m):
        return needle.accuracy(m, held_out, args.batch)

    params = sum(p.numel() for p in model.parameters())
    rows = (f"{args.batch} documents of {args.context // 2} to {args.context} tokens packed in one row"
            if args.pack else f"rows of {args.context} tokens, {args.batch} a step")
    print(f"Training a GPT ({_count(args.layers, 'layer')}, {_count(args.heads, 'head')}, width {args.embd}, "
          f"{params:,} parameters) "
          f"with {target.name}/{exercise.filename} on {where}: {rows}, dropout {args.dropout}, {_count(args.steps, 'step')}, "
          f"the loss {'of the answers alone' if args.loss == 'answers' else 'of every token'}.\n"
          f"{kernels_line(target, yours, args.pack)}\n"
          f"The task: recall the needle hidden anywhere in a row of {args.context} (chance {needle.CHANCE:.1%}).\n"
          f"{'step':>7} {'loss':>8} {'tokens/s':>10} {'accuracy':>9}", flush=True)

    def report(progress):
        print(f"{progress.step:>7} {progress.loss:>8.3f} {progress.tokens_per_s:>10,.0f} {progress.accuracy:>9.1%}",
              flush=True)

    try:
        last = train(model, batch, args.steps, args.lr, args.every, report, evaluate)
    except NotImplementedError as err:
        print(f"Exercise {EXERCISE} is not written yet ({err}): python grader.py {EXERCISE}", file=sys.stderr)
        return 1
    if last.stopped:
        print(f"Stopped at step {last.step} of {args.steps}" + (f": loss {last.loss:.3f}, {last.tokens_per_s:,.0f} "
              f"tokens/s at the end" if last.step else "") + ".")
        return 130
    print(f"Done: {last.step} steps, loss {last.loss:.3f}, {last.tokens_per_s:,.0f} tokens/s at the end, "
          f"accuracy {last.accuracy:.1%} (chance {needle.CHANCE:.1%}).")
    return 0


def run_on_your_kernels(target: Path, passes: Callable[[str], bool], pack: bool) -> set[str]:
    """Have solved() give the learner's kernels the run uses (14's; with --pack 13's too) where they pass
    (none for solutions/, the reference itself): called before 15 loads, which takes their names as it
    loads. Returns the numbers set."""
    yours = set() if is_solutions(target) else {number for number in USES[pack] if passes(number)}
    for number in sorted(yours):
        run_on_yours(number, load(find(number), target))
    return yours


def kernels_line(target: Path, yours: set[str], pack: bool) -> str:
    """Whose kernels a run trains on, and how to make them yours: 14's for rows, and with --pack 13's
    for the packed rows and 14's for the accuracy's rows."""
    return "The kernels: " + "; ".join(use + _whose(number, target, yours) for number, use in USES[pack].items()) + "."


def _whose(number: str, target: Path, yours: set[str]) -> str:
    name = find(number).filename
    if number in yours:
        return f"{target.name}/{name}, yours (its tests pass)"
    if is_solutions(target):
        return f"solutions/{name}, the reference's"
    return f"solutions/{name}, the reference's: yours does not pass its tests (python grader.py {number})"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
