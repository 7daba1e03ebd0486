"""A pytest plugin (`-p kata.grader.pytest_plugin --kata-results FILE`) writing one JSON line per test.

The grader's runner reads FILE, even when the run was cut short: a "start" line before each test
says which test was running when a process hung or died, a "finish" line says pytest ended on its
own. Each "test" line holds the outcome, whether a stub's NotImplementedError caused it, whether the
test is marked `given`, the skip reason, the test's own message and where in the learner's file
the error happened, and the rules the test passed without checking (the user property NOT_CHECKED,
set by tests/conftest.py: the learner's code did not use the helper through which a rule is seen).
"""
from __future__ import annotations

import json
import re
import traceback
from pathlib import Path

import pytest

from kata.gpu import out_of_memory
from kata.unfinished import error_chain, mentions_not_implemented

MAX_LINES, MAX_CHARS, MAX_STDOUT = 12, 1500, 500  # what a learner is shown of one failure
TIMEOUT_PREFIX = "Timeout (>"  # pytest-timeout's failure message
NOT_CHECKED = "not_checked"  # a test's user property: a rule it could not observe, and why


def not_checked_heading(count: int) -> str:
    """The heading over the rules a pytest run passed without checking (tests/conftest.py prints it;
    NOT_CHECKED_HEADING finds it in pytest's output)."""
    return f"{count} rule{'s' * (count != 1)} not checked (their tests pass)"


NOT_CHECKED_HEADING = re.compile(r" (\d+) rules? not checked \(their tests pass\) ")


def pytest_addoption(parser):
    parser.addoption("--kata-results", metavar="FILE", help="write per-test outcomes as JSON lines")


def pytest_configure(config):
    path = config.getoption("kata_results")
    if path:
        config.pluginmanager.register(Recorder(Path(path)), "kata-recorder")


def cap(text: str, lines: int = MAX_LINES, chars: int = MAX_CHARS) -> str:
    """`text` cut to a few lines and characters, with a note saying how much was cut."""
    kept = text.splitlines()[:lines]
    out = "\n".join(kept)[:chars]
    cut = len(text.rstrip()) - len(out)
    return out + (f"\n... ({cut} more characters cut)" if cut > 0 else "")


def message_of(exc: BaseException) -> str:
    """The test's own words: an assertion's message as is, any other error with its type."""
    if isinstance(exc, AssertionError) and str(exc):
        # pytest appends its own `assert a == b` explanation to the test's message: the message is enough.
        message, _, explanation = str(exc).partition("\nassert ")
        return message if message.strip() else f"assert {explanation}"
    if mentions_not_implemented(exc):
        first = str(exc).strip().splitlines()[:1] if isinstance(exc, NotImplementedError) else []
        return f"not started: {first[0] if first else 'a function still raises NotImplementedError'}"
    if isinstance(exc, SystemExit):
        return f"the code called sys.exit({exc.code!r})"
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg}"
    inner = error_chain(exc)[-1]  # the learner's own error, not the wrapper around it
    if line := out_of_memory(inner):
        return line
    text = str(inner)
    return f"{type(inner).__name__}: {text}" if text else type(inner).__name__


def learner_frames(exc: BaseException, target: Path | None) -> list[dict]:
    """The traceback's frames in the target folder's files, innermost last: where the learner's code
    went wrong, also inside an error something else wrapped."""
    frames = []
    for error in error_chain(exc):  # the outer error was raised where the call to the inner one began
        frames += [dict(path=f.filename, line=f.lineno, function=f.name, source=(f.line or "").strip())
                   for f in traceback.extract_tb(error.__traceback__)]
        if isinstance(error, SyntaxError) and error.filename:
            frames.append(dict(path=error.filename, line=error.lineno or 0, function="<module>",
                               source=(error.text or "").strip()))
    if target is None:
        return frames[-1:]
    return [f for f in frames if Path(f["path"]).resolve().parent == target]


class Recorder:
    def __init__(self, path: Path):
        self.file = path.open("a", encoding="utf-8")
        self.tests: dict[str, dict] = {}
        self.target: Path | None = None

    def write(self, **event) -> None:
        self.file.write(json.dumps(event) + "\n")
        self.file.flush()  # the process may die at any moment: os._exit, a kill on timeout

    def pytest_sessionstart(self, session):
        self.target = getattr(session.config, "kata_target", None)  # set by tests/conftest.py

    def pytest_collectreport(self, report):
        if report.failed:
            self.write(event="collect_error", nodeid=report.nodeid, message=cap(str(report.longrepr), 20, 3000))
        elif report.skipped and report.nodeid.endswith(".py"):
            self.write(event="collect_skip", nodeid=report.nodeid, reason=_skip_reason(report))

    def pytest_runtest_logstart(self, nodeid, location):
        self.write(event="start", nodeid=nodeid)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        report.kata_given = item.get_closest_marker("given") is not None
        doc = (getattr(getattr(item, "obj", None), "__doc__", None) or "").strip()
        # A test's docstring names the bug it catches: its first paragraph, as one line.
        report.kata_about = " ".join(doc.split("\n\n")[0].split())
        report.kata_error = None
        if call.excinfo is not None and not report.skipped:
            exc = call.excinfo.value
            frames = learner_frames(exc, self.target)
            report.kata_error = dict(
                message=cap(message_of(exc)),
                not_implemented=mentions_not_implemented(exc),
                timeout=str(exc).startswith(TIMEOUT_PREFIX),
                exit=isinstance(exc, SystemExit),
                frames=frames[-4:],
                seed=getattr(item, "kata_seed", None),  # set by the `rng` fixture: KATA_SEED replays it
            )
        return report

    def pytest_runtest_logreport(self, report):
        test = self.tests.setdefault(report.nodeid, dict(
            event="test", nodeid=report.nodeid, outcome="passed", phase="call", given=False,
            skip_reason=None, seconds=0.0, error=None, stdout="", about=getattr(report, "kata_about", ""),
            not_checked=[]))
        test["seconds"] += report.duration
        test["not_checked"] += [text for name, text in report.user_properties
                                if name == NOT_CHECKED and text not in test["not_checked"]]
        test["given"] |= getattr(report, "kata_given", False)
        if report.capstdout:
            test["stdout"] = cap(test["stdout"] + report.capstdout, 10 ** 6, MAX_STDOUT)
        if report.skipped and test["outcome"] == "passed":
            test.update(outcome="skipped", skip_reason=_skip_reason(report))
        elif report.failed and test["outcome"] != "failed":
            test.update(outcome="failed" if report.when == "call" else "error", phase=report.when,
                        error=getattr(report, "kata_error", None) or dict(message=cap(str(report.longrepr))))
        if report.when == "teardown":
            self.write(**self.tests.pop(report.nodeid))

    def pytest_sessionfinish(self, session, exitstatus):
        self.write(event="finish", exitstatus=int(exitstatus))
        self.file.close()


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")
