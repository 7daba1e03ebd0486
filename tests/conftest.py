"""The one seam between the tests and the code under test: the `ex` fixture.

`ex` is the exercise module named by the test file (tests/test_01_safe_softmax.py tests
01_safe_softmax.py) loaded from the target folder: exercises/ by default, solutions/ with
--solutions, any folder with --target DIR or KATA_TARGET=DIR.
"""
import gc
import importlib.abc
import os
import secrets
import sys
import zlib

import numpy as np
import pytest

from checks import AFTER_CALL, NotChecked
from kata.exercises import find, load, resolve_target
from kata.gpu import out_of_memory, use_triton_mode
from kata.grader.pytest_plugin import NOT_CHECKED, message_of, not_checked_heading
from kata.unfinished import error_chain, mentions_not_implemented


class TritonModeFirst(importlib.abc.MetaPathFinder):
    """Decides how Triton runs (kata.gpu.use_triton_mode) as it is first imported, by whichever test
    file: Triton keeps the mode it loads in, and a file that imports it before triton_helpers
    (test_gpu_compile's importorskip) would otherwise fix the mode of the whole run."""

    def find_spec(self, name, path=None, target=None):
        if name == "triton":
            sys.meta_path.remove(self)
            try:
                import torch
            except ImportError:  # the Triton exercises' tests skip without torch: nothing to decide
                return None
            use_triton_mode(torch)
        return None  # found as usual, by the finders after this one


sys.meta_path.insert(0, TritonModeFirst())


def pytest_addoption(parser):
    group = parser.getgroup("kata")
    group.addoption("--solutions", action="store_true", help="test solutions/ instead of exercises/")
    group.addoption("--target", metavar="DIR", help="test the exercise files in DIR")
    group.addoption("--fresh-seeds", action="store_true",
                    help="draw new random inputs on every run (also KATA_FRESH_SEEDS=1), to hunt for bugs")


def pytest_configure(config):
    """Resolve the target folder once; the grader's plugin reads it from here too."""
    try:
        config.kata_target = resolve_target(config.getoption("solutions"), config.getoption("target"))
    except FileNotFoundError as error:
        raise pytest.UsageError(str(error)) from None


@pytest.fixture(scope="module")
def ex(request):
    stem = request.path.stem.removeprefix("test_")
    return load(find(stem), request.config.kata_target)


def seed_for(request) -> int:
    """KATA_SEED if set; a new seed in fresh-seed mode; else one fixed by the test's file and name,
    so the same code always meets the same inputs and gets the same verdict."""
    if os.environ.get("KATA_SEED"):
        return int(os.environ["KATA_SEED"])
    if request.config.getoption("fresh_seeds") or os.environ.get("KATA_FRESH_SEEDS") == "1":
        return secrets.randbits(32)
    return zlib.crc32(f"{request.path.name}::{request.node.name}".encode())


@pytest.fixture
def rng(request):
    """The test's random inputs; a failure names the seed so that KATA_SEED can replay it."""
    seed = seed_for(request)
    request.node.kata_seed = seed
    return np.random.default_rng(seed)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Run the checks a fixture left in item.stash[AFTER_CALL] once the test's body has passed (or
    ended on a NotChecked rule): a failure there is the test's own, where a fixture's teardown would
    report an error."""
    __tracebackhide__ = True
    try:
        result = yield
    except NotChecked as unseen:  # the test passes; the reports name the rule and why it was not checked
        item.user_properties.append((NOT_CHECKED, str(unseen)))
        result = None
    for check in item.stash.get(AFTER_CALL, []):
        check()
    return result


def pytest_terminal_summary(terminalreporter):
    """The rules no test could check, after pytest's own summary: they passed, but unseen."""
    unseen = sorted({text for report in terminalreporter.stats.get("passed", [])
                     for name, text in report.user_properties if name == NOT_CHECKED})
    if unseen:
        terminalreporter.section(not_checked_heading(len(unseen)))
        for text in unseen:
            terminalreporter.line(text)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """A test file skipped by a helper it imports (triton_helpers, without Triton) is named in the
    skip, where pytest would name the helper's line once for all of them."""
    report = yield
    if report.skipped and isinstance(collector, pytest.Module) and isinstance(report.longrepr, tuple):
        report.longrepr = (str(collector.path), None, report.longrepr[2])
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item):
    """Once the test's fixtures are gone, the GPU memory its tensors held goes back to the card:
    torch's caching allocator keeps it otherwise, and pytest -n's workers, sharing one card, run each
    other out of memory. gc first: a frame kept by an exception's traceback holds tensors in a cycle."""
    result = yield
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.excinfo is None or not report.failed:
        return report
    if mentions_not_implemented(call.excinfo.value) or out_of_memory(error_chain(call.excinfo.value)[-1]):
        report.longrepr = message_of(call.excinfo.value)  # a stub or a full GPU is no bug: one line, no traceback
    elif hasattr(item, "kata_seed"):
        report.sections.append(("random inputs", f"seed {item.kata_seed}: rerun with KATA_SEED={item.kata_seed}"))
    return report
