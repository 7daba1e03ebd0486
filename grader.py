"""The kata's grader: `python grader.py` runs the exercises in order and prints your progress.

    python grader.py                 every exercise, a progress report and the next step
    python grader.py 03              one exercise, each failure in full
    python grader.py hint 03         the next hint for 03 (--all: every hint)
    python grader.py reset 03        put the stub back, keeping your file as a backup (--all, --yes)
    python grader.py solution 03     the solution, once 03 passes (--force: before)
    python grader.py doctor          check Python, NumPy, torch and Triton
    python grader.py train           train 15's GPT with your layer (train --help: its flags)
    python grader.py --watch         re-run the current exercise whenever you save
    python grader.py --show 04 [n_q n_k block_q block_k] [--no-causal]   draw your tile schedule
    python grader.py --bench         time your Triton kernels (06 forward, 09 forward + backward)
    python grader.py --bench paper   the paper's Figure 2 on this GPU (09 against PyTorch attention)
    python grader.py --bench decode  split-KV decoding (10) against the GPU's copy bandwidth
    python grader.py --bench sparse  block-sparse attention (13) against FlexAttention and dense causal
    python grader.py --bench train   15's GPT trained on your kernels against standard attention and SDPA
"""
from __future__ import annotations

import argparse
import os
import signal
import sys

from kata.exercises import format_numbers, numbers_where
from kata.grader.runner import COMPILED_FACTOR, DEFAULT_TIMEOUT, GPU_FACTOR, default_workers

COMMANDS = ("hint", "reset", "solution", "doctor", "train")


class Parser(argparse.ArgumentParser):
    def error(self, message):  # a usage line and the reason, exit code 2, no traceback
        self.exit(2, f"{self.format_usage()}grader.py: error: {message}\nSee: python grader.py --help\n")


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = Parser(prog="grader.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("words", nargs="*", metavar="EXERCISE | COMMAND", help="an exercise (03, 3, merge_partials) "
                   "or a command: " + ", ".join(COMMANDS))
    p.add_argument("--solutions", action="store_true", help="test solutions/ instead of exercises/")
    p.add_argument("--target", metavar="DIR", help="test the exercise files in DIR (also $KATA_TARGET)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                   help=f"seconds one exercise's tests may take in all (default {DEFAULT_TIMEOUT:.0f}; those with a "
                        f"GPU stage, {format_numbers(numbers_where('needs_gpu'))}, get {GPU_FACTOR} times as long in "
                        f"Triton's interpreter, {COMPILED_FACTOR} times on an NVIDIA GPU, where every kernel compiles); "
                        f"one test may take half the exercise's time, the interpreter's on a GPU too")
    p.add_argument("--workers", type=int, default=default_workers(), metavar="N",
                   help="exercises run at once (default: one per CPU core, here %(default)s)")
    p.add_argument("--json", action="store_true", help="machine-readable results")
    p.add_argument("--all", action="store_true", help="hint: every hint; reset: every exercise")
    p.add_argument("--yes", action="store_true", help="reset without asking")
    p.add_argument("--force", action="store_true", help="solution: show it before the exercise passes")
    p.add_argument("--watch", action="store_true", help="re-run the current exercise on every save")
    p.add_argument("--show", nargs="+", metavar="ARG", help="04 [n_q n_k block_q block_k]: draw your tile schedule")
    p.add_argument("--no-causal", dest="causal", action="store_false", help="--show: without the causal mask")
    p.add_argument("--bench", action="store_true", help="time the Triton kernels (06, 09; `paper`, `decode` for "
                   "10, `sparse` for 13); the arguments after it (but --solutions, --target DIR) go to the benchmark")
    p.add_argument("--max-runs", type=int, help=argparse.SUPPRESS)  # --watch: stop after N rounds (tests)
    p.add_argument("--poll", type=float, default=1.0, help=argparse.SUPPRESS)  # --watch: seconds between looks
    argv, rest = _split_bench(argv)
    args = p.parse_args(argv)
    refuse_mismatches(p, args)
    return args, rest


def _split_bench(argv: list[str]) -> tuple[list[str], list[str]]:
    """The grader's arguments and the benchmark's (or train's): everything after --bench (or the word train)
    but the target flags."""
    at = next((i for i, arg in enumerate(argv) if arg == "--bench" or (arg == "train" and argv[i - 1:i] != ["--target"])),
              None)
    if at is None:
        return argv, []
    mine, rest, after = argv[:at + 1], [], iter(argv[at + 1:])
    for arg in after:
        if arg == "--solutions" or arg.startswith("--target="):
            mine.append(arg)
        elif arg == "--target":
            mine += [arg, next(after, "")]
        else:
            rest.append(arg)
    return mine, rest


def refuse_mismatches(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Words and flags that do not go together: exit 2 with the reason, rather than ignore some."""
    if args.timeout <= 0 or args.workers < 1:
        p.error("--timeout and --workers must be positive")
    if args.show and (args.show[0].lstrip("0") != "4" or len(args.show) > 5):
        p.error("--show draws exercise 04's tile schedule: --show 04 [n_q n_k block_q block_k]")
    if args.show and (bad := [n for n in args.show[1:] if not (n.isdigit() and int(n) > 0)]):
        p.error(f"--show 04 takes sizes as positive whole numbers, not {', '.join(map(repr, bad))}")
    command = args.words[0] if args.words and args.words[0] in COMMANDS else None
    if (args.watch or args.bench or args.show) and args.words:
        p.error("--watch, --bench and --show take no exercise or command")
    if args.json and command:
        p.error(f"--json is for the report, not for {command}")
    if command == "doctor" and len(args.words) > 1:
        p.error("doctor takes no exercise")
    if args.all and command == "reset" and len(args.words) > 1:
        p.error("reset takes exercises or --all, not both")


def dispatch(args: argparse.Namespace, rest: list[str]) -> int:
    from kata.grader import commands
    from kata.exercises import EXERCISES, find, resolve_target

    words = args.words
    if words[:1] == ["train"]:
        return commands.run_train(resolve_target(args.solutions, args.target), rest, args.timeout)
    if words[:1] == ["doctor"]:
        from kata.grader.doctor import main
        return main()
    target = resolve_target(args.solutions, args.target)
    if args.show:
        numbers = [int(n) for n in args.show[1:]]
        return commands.show_schedule(find(args.show[0]), numbers, args.causal, target)
    if args.bench:
        return commands.run_bench(target, rest, args.timeout)
    if args.watch:
        from kata.grader.watch import watch
        return watch(target, args.timeout, args.max_runs, args.poll)
    if words and words[0] in COMMANDS:
        command, keys = words[0], words[1:]
        if command == "reset":
            from kata.grader.reset import reset
            if not keys and not args.all:
                raise LookupError("reset which exercise? e.g. python grader.py reset 03 (or reset --all)")
            return reset(EXERCISES if args.all else [find(k) for k in keys], target, args.yes)
        if len(keys) != 1:
            raise LookupError(f"{command} needs one exercise, e.g. python grader.py {command} 03")
        if command == "hint":
            from kata.grader.hints import show
            text, code = show(find(keys[0]), args.all)
            print(text)
            return code
        return commands.show_solution(find(keys[0]), args.force, args.timeout)
    if len(words) > 1:
        raise LookupError("name one exercise at a time, e.g. python grader.py 03")
    if words:
        return commands.run_one(find(words[0]), target, args.timeout, args.json)
    return commands.run_report(target, args.timeout, args.workers, args.json)


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # a polite kill ends the test processes as Ctrl-C does


def main(argv: list[str]) -> int:
    args, rest = parse(argv)
    sys.dont_write_bytecode = True  # loading a learner's file must leave no __pycache__ in exercises/
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return dispatch(args, rest)
    except (LookupError, FileNotFoundError) as error:  # an unknown exercise, a missing --target folder
        print(f"grader.py: error: {error.args[0] if isinstance(error, LookupError) else error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nStopped.", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left early (`| head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as error:  # the grader's own fault: one line, never a traceback
        print(f"grader.py: internal error: {type(error).__name__}: {error}\n"
              f"Please report it; `python grader.py doctor` may show the cause.", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
