"""The one seam between the tests and the code under test: the `ex` fixture.

`ex` is the exercise module named by the test file (tests/test_01_safe_softmax.py tests
01_safe_softmax.py) loaded from the target folder: exercises/ by default, solutions/ with
--solutions, any folder with --target DIR or KATA_TARGET=DIR.
"""
import os
import secrets

import numpy as np
import pytest

from kata.exercises import find, load, resolve_target
from kata.pytest_plugin import mentions_not_implemented, message_of


def pytest_addoption(parser):
    group = parser.getgroup("kata")
    group.addoption("--solutions", action="store_true", help="test solutions/ instead of exercises/")
    group.addoption("--target", metavar="DIR", help="test the six exercise files in DIR")


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


@pytest.fixture
def rng(request):
    """Fresh random inputs every run; a failure names the seed so it can be replayed."""
    seed = int(os.environ.get("KATA_SEED") or secrets.randbits(32))
    request.node.kata_seed = seed
    return np.random.default_rng(seed)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.excinfo is None or report.passed:
        return report
    if mentions_not_implemented(call.excinfo.value):
        report.longrepr = message_of(call.excinfo.value)  # a stub is not a bug: one line, no traceback
    elif hasattr(item, "kata_seed"):
        report.sections.append(("random inputs", f"seed {item.kata_seed}: rerun with KATA_SEED={item.kata_seed}"))
    return report
