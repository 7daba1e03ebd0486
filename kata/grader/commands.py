"""The grader's commands: the report, one exercise in full, a solution, the schedule drawing, the bench."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from kata.grader import report
from kata.tools import io_report, schedule_view
from kata.exercises import EXERCISES, EXERCISES_DIR, SOLUTIONS_DIR, Exercise, find, load
from kata.grader.progress import Progress
from kata.grader.results import ExerciseResult, display_path
from kata.grader.runner import known_result, run_exercise, run_many, run_tests

IO_EXERCISE = ("05", "08")  # forward, backward: once each passes, the report shows its IO table
SPARSE_EXERCISE = "12"  # once it passes: block-sparse traffic at 64k


def label(target: Path) -> str:
    return display_path(target).rstrip("/") + "/"


def remember(results: list[ExerciseResult], target: Path) -> None:
    """Passes of the learner's own files unlock their solutions."""
    if target == EXERCISES_DIR.resolve():
        Progress().mark_passed([r.exercise.number for r in results if r.ok])


def run_report(target: Path, timeout: float, workers: int, json_out: bool) -> int:
    """`python grader.py`: every exercise, a table, the progress bar and the next step."""
    results = run_many(EXERCISES, target, timeout, workers, on_result=None if json_out else _ticker)
    _clear_ticker()
    remember(results, target)
    if json_out:
        print(report.as_json(results, str(target)))
    else:
        print(report.summary(results, label(target)))
        _io_table(results, target)
    return 0 if report.all_ok(results) else 1


def run_one(exercise: Exercise, target: Path, timeout: float, json_out: bool) -> int:
    """`python grader.py 03`: one exercise, every failure in full."""
    result = run_exercise(exercise, target, timeout)
    remember([result], target)
    print(report.as_json([result], str(target)) if json_out else report.details(result))
    if not json_out:
        _io_table([result], target)
    return 0 if report.all_ok([result]) else 1


def show_solution(exercise: Exercise, force: bool, timeout: float) -> int:
    """`python grader.py solution 03`: the solution, once the learner's own file passes."""
    path = SOLUTIONS_DIR / exercise.filename
    if not path.is_file():
        print(f"There is no {display_path(path)}.")
        return 1
    if not Progress().has_passed(exercise.number):
        result = run_exercise(exercise, EXERCISES_DIR.resolve(), timeout)
        remember([result], EXERCISES_DIR.resolve())
        if not result.ok and not force:
            print(f"The solution to {exercise.number} opens once {display_path(result.path)} passes "
                  f"(now: {result.status}{report.tally(result)}).\n"
                  f"Keep going: python grader.py {exercise.number}    Hint: python grader.py hint {exercise.number}\n"
                  f"To read it anyway: python grader.py solution {exercise.number} --force")
            return 1
        if not result.ok:
            print(f"warning: {exercise.number} does not pass yet; reading the solution first skips the "
                  f"part where you learn it.\n", file=sys.stderr)
    print(f"# {display_path(path)}\n")
    print(path.read_text(encoding="utf-8"))
    return 0


def show_schedule(exercise: Exercise, numbers: list[int], causal: bool, target: Path) -> int:
    """`python grader.py --show 04 [n_q n_k block_q block_k]`: draw the learner's tile schedule."""
    sizes = dict(zip(["n_q", "n_k", "block_q", "block_k"], numbers))
    picture, ok = schedule_view.show(load(exercise, target), **sizes, causal=causal)
    print(picture)
    return 0 if ok else 1


def run_bench(target: Path, argv: list[str], timeout: float) -> int:
    from kata.bench.main import main  # the benchmarks' modules, loaded only when one is asked for
    return main(target, argv, _passes(target, timeout))


def run_train(target: Path, argv: list[str], timeout: float) -> int:
    from kata.tools import train  # torch and the model, loaded only when asked for
    return train.main(target, argv, _passes(target, timeout))


def _passes(target: Path, timeout: float) -> Callable[[str], bool]:
    """passes(number): whether exercise `number`'s file in `target` passes its tests as it is now, asked
    where training would run on the learner's kernel: the grader's cached result where it has one,
    else the tests run, as `python grader.py NN` runs them."""
    def passes(number: str) -> bool:
        exercise = find(number)
        if (result := known_result(exercise, target, timeout)) is None:
            print(f"Running {number}'s tests first: training runs on your kernels once they pass.",
                  file=sys.stderr, flush=True)
            result = run_tests(exercise, target, timeout)
            remember([result], target)
        return result.ok
    return passes


def _io_table(results: list[ExerciseResult], target: Path) -> None:
    """After 05 passes: how much the fused forward saves; after 08, forward + backward; after 12,
    what block sparsity saves at 64k. From the learner's own code."""
    forward, backward = IO_EXERCISE
    ok = {r.exercise.number: r.ok for r in results}
    if ok.get(forward):
        print("\n" + io_report.table(load(find(forward), target)))
    if ok.get(backward) and ok.get(forward, True):  # `grader.py 08` alone: 05's closed forms are tried as they are
        print("\n" + io_report.training_table(lambda: load(find(forward), target),
                                              lambda: load(find(backward), target)))
    if ok.get(SPARSE_EXERCISE):
        print("\n" + io_report.sparse_table(load(find(SPARSE_EXERCISE), target)))


def _ticker(result: ExerciseResult) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(f"\r  {result.exercise.number} {result.exercise.name}: {result.status}".ljust(60))
        sys.stderr.flush()


def _clear_ticker() -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r" + " " * 60 + "\r")
