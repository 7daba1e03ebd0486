"""What the learner reads: the progress table, the next thing to do, one exercise's failures, JSON."""
from __future__ import annotations

import json
import textwrap
import time

from tabulate import tabulate

from kata.exercises import format_numbers, numbers_where
from kata.gpu import NO_GPU
from kata.grader.results import (FAILING, MISSING, NOT_STARTED, PASSED, SKIPPED, ExerciseResult, Failure, TestResult,
                                 display_path)

WIDTH = 80  # the report fits a plain terminal
BAR = 30  # characters in the progress bar
DETAIL_TESTS = 5  # failing test functions shown in full by `python grader.py NN`, one case each
PRINTED_LINES = 8  # of what a failing test printed
ABOUT = "bugs this test catches (yours may be one, or another)"  # before the test's docstring
CONVENTION = "  convention:"  # how a test's message states the rule it enforces (tests/checks.py)
BENCH = "python grader.py --bench    (python grader.py --help lists every benchmark)"


def table(results: list[ExerciseResult]) -> str:
    rows = [[r.exercise.number, r.exercise.name, r.status, _count(r), _time(r), r.note] for r in results]
    text = tabulate(rows, headers=["#", "exercise", "status", "tests", "time", "note"], tablefmt="simple",
                    colalign=("left", "left", "left", "right", "right", "left"))
    return "\n".join(_cut(line) for line in text.splitlines())


def progress(results: list[ExerciseResult]) -> str:
    done = sum(r.ok for r in results)
    filled = round(BAR * done / len(results)) if results else 0
    return f"[{'#' * filled}{'-' * (BAR - filled)}]  {done} of {len(results)} exercises passed"


def summary(results: list[ExerciseResult], target_label: str) -> str:
    """The whole report: title, table, progress bar and the next step."""
    parts = [f"FlashAttention Kata: testing {target_label}", "", table(results), *skipped_why(results),
             *cached_why(results), "", progress(results), ""]
    return "\n".join(parts + [next_step(results)])


def skipped_why(results: list[ExerciseResult]) -> list[str]:
    """Why each exercise that could not run here was skipped, in full: the table's note is cut."""
    return [line for r in results if r.status == SKIPPED
            for line in _wrap(f"{r.exercise.number} skipped: {r.note}", indent="")]


def cached_why(results: list[ExerciseResult]) -> list[str]:
    """Which rows are an earlier run's, unchanged since: their times were measured then, not now."""
    cached = [r for r in results if r.cached]
    if not cached:
        return []
    which = "every exercise" if len(cached) == len(results) else format_numbers([r.exercise.number for r in cached])
    when = when_ran(max(r.finished_at for r in cached))
    return _wrap(f"cached: {which} unchanged since its last run (the latest at {when}), not run again", indent="")


def when_ran(finished_at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(finished_at))


def next_step(results: list[ExerciseResult]) -> str:
    current = next((r for r in results if not r.ok and r.status != SKIPPED), None)
    if current is None:
        gpu_skips = [why for r in results if r.exercise.needs_gpu for why in _gpu_skips(r)]
        if any("nvidia-smi" in why for why in gpu_skips):  # a GPU is there, but torch cannot use it
            reason = next(why for why in gpu_skips if "nvidia-smi" in why)
            return "\n".join(["Every exercise passes on the CPU, but the GPU tests were skipped:"]
                             + _wrap(reason, indent="  "))
        if gpu_skips:
            stages = format_numbers(numbers_where("needs_gpu"))
            return "\n".join(["Every exercise passes on the CPU. On a machine with a CUDA GPU, run",
                              "  python grader.py", *textwrap.wrap(f"again to test {stages} compiled, then time your "
                                                                   f"kernels with", WIDTH), f"  {BENCH}"])
        return f"Every exercise passes. Time your kernels with\n  {BENCH}"
    ex = current.exercise
    lines = [f"Next: {ex.number} {ex.name}, {ex.title} ({current.status})", f"  open {display_path(current.path)}"]
    if current.failure:
        where = f"{current.failure.test}: " if current.failure.test else ""  # no test name: none was run
        lines += _wrap(where + current.failure.message.strip().splitlines()[0], indent="  ")
        frame = current.failure.frames[-1] if current.failure.frames else None
        if frame:
            lines.append(_cut(f"  at {display_path(frame['path'])}:{frame['line']} in {frame['function']}"))
    if current.status != MISSING:
        lines.append(f"Details: python grader.py {ex.number}    Hint: python grader.py hint {ex.number}")
    return "\n".join(lines)


def _gpu_skips(result: ExerciseResult) -> list[str]:
    """Why a GPU exercise's GPU tests did not run: no usable CUDA GPU, or no Triton. A GPU run skips
    other tests (those of the interpreter), for other reasons."""
    if result.status == SKIPPED:
        return [result.note]
    return [t.skip_reason for t in result.tests if t.outcome == "skipped" and t.skip_reason
            and (NO_GPU in t.skip_reason or "nvidia-smi" in t.skip_reason)]


def details(result: ExerciseResult) -> str:
    """One exercise in full: each failing test's message and the learner's lines it went through."""
    ex, note = result.exercise, f" ({result.note})" if result.note else ""
    untouched = result.status == NOT_STARTED and not result.tests  # the stub as given: no test was run
    ran = ", no test run: the file is untouched" if untouched else f", {result.seconds:.1f} s"
    if result.cached:
        ran = f", cached from {when_ran(result.finished_at)}, the file and its tests unchanged since"
    lines = [f"{ex.number} {ex.name}: {result.status}{tally(result)}{ran}{note}"]
    if result.not_checked:  # passed all the same: a rule is seen only through a helper the code did not use
        lines += ["", "Rules not checked (the tests see them only through the stub's helpers):"]
        lines += [wrapped for text in result.not_checked for wrapped in _wrap(text, indent="  ")]
    broken = [t for t in result.tests if t.broken]
    if result.status not in (FAILING, NOT_STARTED):  # crashed, timed out, missing: one cause
        broken = []
        if result.failure:
            lines += ["", f"{result.failure.test}:"] + _failure_lines(result.failure)
    elif result.status == NOT_STARTED:
        heading = "The first function to write:" if untouched else f"{len(broken)} tests not started, the first:"
        lines += ["", heading] + _failure_lines(result.failure)
        broken = []
    stubs = [t for t in broken if t.flag("not_implemented")]
    checks = _by_function([t for t in broken if not t.flag("not_implemented")])  # wrong before unwritten
    for first, *others in checks[:DETAIL_TESTS]:
        seed = first.error.get("seed") if first.error else None
        # The docstring names the bugs the test was written to catch: candidates, not a diagnosis,
        # shown before the convention's longer words.
        about = _wrap(f"  {ABOUT}: {first.about}") if first.about else []
        also = [_also_failing(others)] if others else []
        lines += ["", f"FAILED {first.name}"] + _failure_lines(Failure.of(first), seed=seed, about=about) + also
    if len(checks) > DETAIL_TESTS:
        lines += ["", f"... and {len(checks) - DETAIL_TESTS} more failing tests"]
    if stubs:  # a half-written file: the tests of its unwritten functions, after any wrong ones
        lines += ["", f"{len(stubs)}{' more' if checks else ''} tests not started: {Failure.of(stubs[0]).message}"]
    if not result.ok and result.status != MISSING:
        lines += ["", f"Stuck? python grader.py hint {ex.number}"]
    return "\n".join(lines)


def _by_function(tests: list[TestResult]) -> list[list[TestResult]]:
    """Failing tests grouped by test function, in order: the parametrized cases of one check together."""
    groups: dict[str, list[TestResult]] = {}
    for test in tests:
        groups.setdefault(test.nodeid.partition("[")[0], []).append(test)
    return list(groups.values())


def tally(result: ExerciseResult) -> str:
    """", 3 of 54 tests pass" when the tests ran to their end, else nothing."""
    return f", {result.passed} of {result.total} tests pass" if _count(result) != "-" else ""


def _also_failing(others: list[TestResult]) -> str:
    """The other failing cases of a test, by their ids, on one line: as many as fit, then how many more."""
    ids = ["[" + t.name.partition("[")[2] for t in others]
    for shown in range(len(ids), 0, -1):
        more = f" and {len(ids) - shown} more" if shown < len(ids) else ""
        line = "  also failing: " + ", ".join(ids[:shown]) + more
        if len(line) <= WIDTH:
            return line
    return f"  also failing: {len(ids)} more cases"


def as_json(results: list[ExerciseResult], target: str) -> str:
    return json.dumps({
        "target": target,
        "exercises": [dict(number=r.exercise.number, name=r.exercise.name, status=r.status, passed=r.passed,
                           total=r.total, seconds=round(r.seconds, 3), cached=r.cached, note=r.note,
                           not_checked=r.not_checked,
                           first_failure=_failure_json(r.failure)) for r in results],
        "passed": sum(r.ok for r in results),
        "total": len(results),
        "ok": all_ok(results),
    }, indent=2)


def all_ok(results: list[ExerciseResult]) -> bool:
    """Everything that ran passed (an exercise skipped for lack of a GPU or Triton did not run)."""
    return all(r.status in (PASSED, SKIPPED) for r in results)


def _failure_lines(failure: Failure, max_lines: int = 40, seed: int | None = None, about: list[str] = ()) -> list[str]:
    """The test's message, `about` (the bugs it catches) before the message's convention, then where
    in the learner's file, what the code printed and the seed."""
    head, mark, convention = failure.message.partition(f"\n{CONVENTION}")
    message = [wrapped for line in head.splitlines() for wrapped in _wrap(line)] + list(about)
    message += [wrapped for line in (mark + convention).strip("\n").splitlines() for wrapped in _wrap(line)]
    if len(message) > max_lines:
        message = message[:max_lines] + [f"    ... ({len(message) - max_lines} more lines)"]
    lines = message
    for frame in failure.frames[-2:]:
        lines.append(_cut(f"  at {display_path(frame['path'])}:{frame['line']} in {frame['function']}"))
        if frame.get("source"):
            lines.append(_cut(f"      {frame['source']}"))
    if failure.stdout:
        printed = failure.stdout.splitlines()
        lines += ["  printed:"] + [f"    {_cut(line, WIDTH - 4)}" for line in printed[:PRINTED_LINES]]
        if len(printed) > PRINTED_LINES:
            lines.append(f"    ... ({len(printed) - PRINTED_LINES} more lines)")
    if seed is not None:
        lines.append(f"  random inputs: rerun the same ones with KATA_SEED={seed}")
    return lines


def _failure_json(failure: Failure | None) -> dict | None:
    if failure is None:
        return None
    frame = failure.frames[-1] if failure.frames else None
    location = f"{display_path(frame['path'])}:{frame['line']}" if frame else None
    return dict(test=failure.test or None, message=failure.message, location=location)


def _wrap(line: str, indent: str = "    ") -> list[str]:
    """`line` wrapped to the width, continuation lines indented past the line's own indentation."""
    own = indent + line[:len(line) - len(line.lstrip())]
    return textwrap.wrap(line.strip(), WIDTH - 2, initial_indent=own, subsequent_indent=own + "  ",
                         break_on_hyphens=False) or [""]


def _count(r: ExerciseResult) -> str:
    """Counts mean something only when the run went to its end."""
    return f"{r.passed}/{r.total}" if r.total and r.status in (PASSED, FAILING, NOT_STARTED) else "-"


def _time(r: ExerciseResult) -> str:
    if r.cached:
        return "cached"
    return f"{r.seconds:.1f}s" if r.seconds else "-"


def _cut(line: str, width: int = WIDTH) -> str:
    return line if len(line) <= width else line[:width - 3] + "..."
