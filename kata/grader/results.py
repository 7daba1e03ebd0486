"""What one exercise's test run came to: each test's outcome, and the exercise's status."""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from kata.exercises import Exercise
from kata.grader.stub import Stub, todo_message

PASSED, FAILING, NOT_STARTED = "passed", "failing", "not started"
CRASHED, TIMED_OUT, SKIPPED, MISSING = "crashed", "timed out", "skipped", "missing"
INTERRUPTED_EXITS = {2, 3, 4}  # pytest: interrupted, internal error, usage error


@dataclass
class TestResult:
    nodeid: str
    outcome: str  # passed, failed, error (outside the test body), skipped
    phase: str = "call"
    given: bool = False
    skip_reason: str | None = None
    seconds: float = 0.0
    error: dict | None = None  # message, not_implemented, timeout, exit, frames
    stdout: str = ""
    about: str = ""  # the test's docstring, first line: the bug it catches
    not_checked: list[str] = field(default_factory=list)  # rules it passed without seeing, and why

    @property
    def name(self) -> str:
        return self.nodeid.rsplit("::", 1)[-1]

    @property
    def broken(self) -> bool:
        return self.outcome in ("failed", "error")

    def flag(self, key: str) -> bool:
        return bool(self.error and self.error.get(key))


@dataclass
class Failure:
    """The one thing to fix first: which test, its own message, where in the learner's file."""
    test: str
    message: str
    frames: list[dict] = field(default_factory=list)
    stdout: str = ""

    @classmethod
    def of(cls, test: TestResult, message: str | None = None) -> Failure:
        error = test.error or {}
        return cls(test.name, message or error.get("message", test.outcome), error.get("frames", []), test.stdout)


@dataclass
class ExerciseResult:
    exercise: Exercise
    path: Path  # the learner's file
    status: str
    passed: int = 0
    total: int = 0
    seconds: float = 0.0
    note: str = ""
    failure: Failure | None = None
    tests: list[TestResult] = field(default_factory=list)
    finished_at: float = 0.0  # when its test run ended (time.time()); 0 where no test ran
    # Read from the cache (the file unchanged since): its seconds and finished_at are that earlier run's,
    # also when this grader made it (a --watch session saving a file back to bytes it had before).
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.status == PASSED

    @property
    def not_checked(self) -> list[str]:
        """The rules some passing test could not observe, and why, each once (parametrized cases repeat them)."""
        return list(dict.fromkeys(text for t in self.tests if t.outcome == "passed" for text in t.not_checked))


def classify(exercise: Exercise, path: Path, events: list[dict], *, returncode: int | None, killed_after: float | None,
             seconds: float, output: str) -> ExerciseResult:
    """The exercise's status from the plugin's events and how the process ended."""
    tests = [TestResult(**{k: v for k, v in e.items() if k != "event"}) for e in events if e["event"] == "test"]
    # The tally is pytest's: every test that ran, those of the given code too (a stub passes them, so
    # they do not decide whether the exercise was started).
    ran = [t for t in tests if t.outcome != "skipped"]
    counted = [t for t in ran if not t.given]
    result = ExerciseResult(exercise, path, FAILING, sum(t.outcome == "passed" for t in ran), len(ran), seconds,
                            tests=tests, finished_at=time.time())
    if _cut_short(result, events, returncode, killed_after, output):
        return result
    skipped = [t for t in tests if t.outcome == "skipped"]
    # A real failure comes before a stub's: a wrong function matters more than one not yet written.
    first = next((t for t in tests if t.broken and not t.flag("not_implemented")), None) \
        or next((t for t in tests if t.broken), None)
    if skipped and not counted and first is None:
        return _with(result, SKIPPED, note=skipped[0].skip_reason or "skipped")
    note = f"{len(skipped)} skipped: {skipped[0].skip_reason}" if skipped else ""
    if counted and all(t.flag("not_implemented") for t in counted):
        return _with(result, NOT_STARTED, Failure.of(counted[0]), note)
    if first is None:
        unseen = len(result.not_checked)
        unseen_note = f"{unseen} rule{'s' * (unseen != 1)} not checked" if unseen else ""
        return _with(result, PASSED, note="; ".join(filter(None, (unseen_note, note))))
    return _with(result, FAILING, Failure.of(first), note)


def _cut_short(result: ExerciseResult, events: list[dict], returncode: int | None, killed_after: float | None,
               output: str) -> bool:
    """Set `result` to timed out, crashed or skipped when the run did not get through its tests."""
    tests, running = result.tests, _running(events)
    hung = next((t for t in tests if t.flag("timeout")), None)
    finish = next((e for e in events if e["event"] == "finish"), None)
    collect = {e["event"]: e for e in events if e["event"] in ("collect_error", "collect_skip")}
    crash = next((t for t in tests if t.flag("exit") or (t.outcome == "error" and t.phase == "setup"
                                                          and not t.flag("not_implemented"))), None)
    if killed_after is not None or hung:
        where = Failure.of(hung) if hung else Failure(running or "(before the first test)", "")
        if hung:
            limit = re.search(r"Timeout \(>([\d.]+)s\)", hung.error["message"])
            seconds = f"{float(limit.group(1)):g}" if limit else "?"
            where.message = (f"too slow: test {hung.name} ran over {seconds} s, "
                             f"the most one test may take (--timeout raises it)")
        else:
            where.message = (f"too slow: over {killed_after:.0f} s, the most this exercise's tests may take in all "
                             f"(--timeout), " + (f"still in test {running}" if running else "before any test began"))
        _with(result, TIMED_OUT, where)
    elif "collect_error" in collect:
        _with(result, CRASHED, Failure(collect["collect_error"]["nodeid"], collect["collect_error"]["message"]))
    elif finish is None:
        _with(result, CRASHED, Failure(running or "(before the first test)", f"the test process died (exit code "
                                       f"{returncode}){' while running this test' if running else ''}"))
    elif crash:
        failure = Failure.of(crash)
        if crash.phase == "setup":  # the `ex` fixture imports the file: no test of it ran
            failure.test = f"importing {display_path(result.path)}"
        _with(result, CRASHED, failure)
    elif "collect_skip" in collect and not tests:  # the whole test file skipped, e.g. no Triton
        _with(result, SKIPPED, note=collect["collect_skip"]["reason"])
    elif finish["exitstatus"] in INTERRUPTED_EXITS or not tests:
        _with(result, CRASHED, Failure("pytest", _tail(output) or f"pytest exited with {returncode}"))
    else:
        return False
    return True


def skipped_result(exercise: Exercise, path: Path, reason: str) -> ExerciseResult:
    return ExerciseResult(exercise, path, SKIPPED, note=reason)


def untouched_result(exercise: Exercise, path: Path, stub: Stub) -> ExerciseResult:
    """A file that is still its stub: not started, without a test run, pointing at the first stub line."""
    line, function = stub.todos[0]
    frame = dict(path=str(path), line=line, function=function, source=stub.text.splitlines()[line - 1].strip())
    failure = Failure("", f"{NOT_STARTED}: {todo_message(function)}", [frame])
    return ExerciseResult(exercise, path, NOT_STARTED, failure=failure)


def missing_result(exercise: Exercise, path: Path, missing: Path) -> ExerciseResult:
    return ExerciseResult(exercise, path, MISSING, failure=Failure("(no test run)", f"{display_path(missing)} is missing"))


def _with(result: ExerciseResult, status: str, failure: Failure | None = None, note: str = "") -> ExerciseResult:
    result.status, result.failure, result.note = status, failure, note
    return result


def _running(events: list[dict]) -> str | None:
    """The test that started and never reported: where a killed or dead process was."""
    started = [e["nodeid"] for e in events if e["event"] == "start"]
    done = {e["nodeid"] for e in events if e["event"] == "test"}
    pending = [n for n in started if n not in done]
    return pending[-1].rsplit("::", 1)[-1] if pending else None


def _tail(output: str, lines: int = 8) -> str:
    return "\n".join(output.strip().splitlines()[-lines:])


def display_path(path: str | Path) -> str:
    """A path as the learner sees it: relative to where they are, when it is below."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except (ValueError, OSError):
        return str(path)
