"""The grader's pieces in-process: status rules, the report's layout, backups, the plugin's functions."""
import os
import signal
import subprocess
import sys
import threading
import time
from multiprocessing import forkserver
from pathlib import Path

import pytest

from kata import gpu
from kata.grader import launch, progress, reset, runner
from kata.exercises import EXERCISES, ROOT, find, format_numbers, numbers_where
from kata.grader.pytest_plugin import cap
from kata.unfinished import mentions_not_implemented
from kata.grader.report import details, summary
from kata.grader.results import Failure, classify
from kata.grader.runner import process_environment, run_pytest

FINISH = {"event": "finish", "exitstatus": 1}
LONG = ("tiled_attention(q (37, 16) float32, k (41, 16) float32, block_q 8, block_k 16, causal): "
        "row 12 is wrong (off by 0.25 at index (12, 3))\n  expected: [0.1 0.2 0.3 ... 0.7 0.8 0.9]\n"
        "  got:      [0.1 0.2 0.3 ... 0.7 0.8 1.9]\n  convention: rescale acc when m grows\n") * 3


def ran(name, outcome="passed", **extra):
    return {"event": "test", "nodeid": f"tests/t.py::{name}", "outcome": outcome, **extra}


def error(message, **flags):
    return {"message": message, "frames": [{"path": "exercises/x.py", "line": 3, "function": "f",
                                            "source": "return x " * 20}], **flags}


def result(events, number="04", **kw):
    ex = next(e for e in EXERCISES if e.number == number)
    kw = {"returncode": 1, "killed_after": None, "seconds": 0.5, "output": "", **kw}
    return classify(ex, Path("exercises") / ex.filename, events, **kw)


@pytest.mark.parametrize("events, status", [
    ([ran("a"), ran("b", given=True), FINISH], "passed"),
    ([ran("a", "failed", error=error("not started: f", not_implemented=True)),
      ran("b", given=True), FINISH], "not started"),
    ([ran("a", "failed", error=error("not started: f", not_implemented=True)), ran("b"), FINISH], "failing"),
    ([ran("a", "skipped", skip_reason="needs a CUDA device"), FINISH], "skipped"),
    ([ran("a", given=True), FINISH], "passed"),
    ([ran("a"), ran("b", "skipped", skip_reason="needs a CUDA device"), FINISH], "passed"),
    ([ran("a", "error", phase="setup", error=error("SyntaxError: invalid syntax")), FINISH], "crashed"),
    ([ran("a", "failed", error=error("the code called sys.exit(1)", exit=True)), FINISH], "crashed"),
    ([{"event": "collect_error", "nodeid": "tests/t.py", "message": "ImportError"}, FINISH], "crashed"),
    ([{"event": "start", "nodeid": "tests/t.py::a"}], "crashed"),
    ([FINISH], "crashed"),
    ([{"event": "collect_skip", "nodeid": "tests/t.py", "reason": "could not import 'triton'"}, FINISH], "skipped"),
    ([ran("a", "failed", error=error("Timeout (>1s)", timeout=True)), FINISH], "timed out"),
], ids=["pass-given-uncounted", "stub", "half-started", "all-gpu-skipped", "only-given", "pass-with-skips", "syntax-error",
        "sys-exit", "test-file-broken", "process-died", "no-tests", "file-skipped", "pytest-timeout"])
def test_status_rules(events, status):
    assert result(events).status == status


def test_a_process_killed_on_timeout_names_the_test_it_was_in():
    """A timeout says what was too slow and where, in the words --timeout's help uses; no guessing."""
    r = result([{"event": "start", "nodeid": "tests/t.py::test_slow[nq5]"}], killed_after=60.0)
    assert r.status == "timed out" and r.failure.test == "test_slow[nq5]"
    assert r.failure.message.startswith("too slow: over 60 s") and "test_slow[nq5]" in r.failure.message
    assert "endless" not in r.failure.message


def test_a_test_over_the_per_test_limit_is_named_with_its_limit():
    r = result([ran("test_big[n16384]", "failed", error=error("Timeout (>15.0s) from pytest-timeout.", timeout=True)),
                FINISH])
    assert r.failure.message.startswith("too slow: test test_big[n16384] ran over 15 s")
    assert "endless" not in r.failure.message


def test_the_report_of_every_status_fits_80_columns_and_30_lines():
    """Long messages, long notes, long source lines: all cut to a plain terminal."""
    failing = result([ran("test_ragged[nq37-nk41-bq8-bk16-causal]", "failed", error=error(LONG)), FINISH])
    rows = [result([ran("a"), FINISH], "01"), result([FINISH], "02"), failing,
            result([ran("a"), ran("b", "skipped", skip_reason="needs a CUDA device " * 5), FINISH], "05"),
            result([{"event": "start", "nodeid": "t::a"}], "06", killed_after=300.0),
            result([ran("a", "failed", error=error("x", not_implemented=True)), FINISH], "03")]
    text = summary(rows, "exercises/")
    assert max(map(len, text.splitlines())) <= 80 and len(text.splitlines()) <= 30, text
    assert "Next: 02 online_softmax, one pass: running max and running sum (crashed)" in text and "2 of 6 exercises passed" in text
    full = details(failing)
    assert "FAILED test_ragged[nq37-nk41-bq8-bk16-causal]" in full and "row 12 is wrong" in full
    assert max(map(len, full.splitlines())) <= 80


def test_not_implemented_is_found_through_wrapping_errors():
    """A Triton compile error of a `raise NotImplementedError` in a jit function is a stub, not a bug."""
    class CompilationError(Exception):
        pass
    try:
        try:
            raise NotImplementedError("kernel: replace this line")
        except NotImplementedError as inner:
            raise CompilationError("at 12:4: compile failed") from inner
    except CompilationError as outer:
        assert mentions_not_implemented(outer)
    assert mentions_not_implemented(RuntimeError("NotImplementedError('tile: replace this line')"))
    assert not mentions_not_implemented(ValueError("shape"))


def test_cap_says_how_much_was_cut():
    assert cap("x" * 2000, chars=100).endswith("(1900 more characters cut)")
    assert cap("short") == "short"


def test_two_backups_in_the_same_second_get_two_names(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "BACKUP_DIR", tmp_path)
    monkeypatch.setattr(reset, "BACKUP_DIR", tmp_path)
    monkeypatch.setattr(progress, "now", lambda: "2026-11-29T10:40:00")
    learner = tmp_path / "mine.py"
    kept = []
    for text in ("one", "two", "three"):
        learner.write_text(text)
        kept.append(reset._backup(EXERCISES[2], learner))
    assert [p.name for p in kept] == ["03_merge_partials.2026-11-29T10-40-00.py",
                                      "03_merge_partials.2026-11-29T10-40-00-2.py",
                                      "03_merge_partials.2026-11-29T10-40-00-3.py"]
    assert [p.read_text() for p in kept] == ["one", "two", "three"]


def test_without_triton_the_kernel_exercise_is_skipped_with_a_reason(monkeypatch):
    monkeypatch.setattr(gpu.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert gpu.triton_missing() == "Triton needs Linux"
    monkeypatch.setattr(sys, "platform", "linux")
    assert gpu.triton_missing() == "Triton is not installed"


def test_failure_of_a_test_keeps_its_printed_output():
    r = result([ran("a", "failed", error=error("boom"), stdout="hello"), FINISH])
    assert r.failure == Failure("a", "boom", error("boom")["frames"], "hello")


def test_details_show_one_case_of_each_failing_test():
    """Cases of one parametrized test are one check: shown once, the other ids on a line, so that the
    five shown are five different checks."""
    cases = [ran(f"test_rows[n{n}]", "failed", error=error(f"row {n} wrong"), about="Rows dropped.")
             for n in (1, 2, 3)]
    checks = [ran(f"test_check{i}", "failed", error=error(f"check {i} wrong")) for i in range(6)]
    text = details(result([*cases[:2], checks[0], cases[2], *checks[1:], FINISH]))
    assert text.count("FAILED ") == 5 and "FAILED test_rows[n1]" in text and "row 1 wrong" in text
    assert "row 2 wrong" not in text and "  also failing: [n2], [n3]\n" in text
    assert [line.split()[1] for line in text.splitlines() if line.startswith("FAILED")] == [
        "test_rows[n1]", "test_check0", "test_check1", "test_check2", "test_check3"]
    assert "... and 2 more failing tests" in text
    assert "  bugs this test catches (yours may be one, or another): Rows dropped." in text


def test_details_of_a_half_written_file_name_what_is_not_started():
    """A file whose written functions pass and whose others are stubs is failing: its details say which
    tests wait for which function, where they once said nothing beyond the count."""
    text = details(result([ran("a"), ran("b", "failed", error=error("not started: f", not_implemented=True)),
                           ran("c", "failed", error=error("not started: f", not_implemented=True)), FINISH]))
    assert text.splitlines()[0].startswith("04 tiled_attention: failing, 1 of 3 tests pass")
    assert "2 tests not started: not started: f" in text


def test_many_failing_cases_of_one_test_fit_one_line():
    ids = [f"nq{n}-nk{n + 1}-bq2-bk3-causal" for n in range(40)]
    text = details(result([ran(f"test_ragged[{i}]", "failed", error=error("wrong")) for i in ids] + [FINISH]))
    also = next(line for line in text.splitlines() if line.startswith("  also failing: "))
    assert len(also) <= 80 and also.startswith(f"  also failing: [{ids[1]}], [{ids[2]}]")
    shown = also.count("[")
    assert also.endswith(f" and {len(ids) - 1 - shown} more"), also


@pytest.mark.parametrize("numbers, text", [([], ""), (["06"], "06"), (["06", "09"], "06 and 09"),
                                           (["06", "09", "10", "13"], "06, 09, 10 and 13")])
def test_numbers_read_as_a_sentence(numbers, text):
    assert format_numbers(numbers) == text


def test_the_texts_name_every_exercise_with_a_gpu_stage_or_torch():
    """Help, doctor and the closing message derive their lists from the exercise list."""
    from kata.grader.doctor import known_problems
    stages, torch = format_numbers(numbers_where("needs_gpu")), format_numbers(numbers_where("needs_torch"))
    help_text = subprocess.run([sys.executable, str(ROOT / "grader.py"), "--help"], capture_output=True, text=True,
                               env={**os.environ, "COLUMNS": "200"}).stdout
    assert f"those with a GPU stage, {stages}, get" in help_text
    problems = " ".join(text for _, text in known_problems({"numpy": "2.4", "torch": None, "triton": "3.9"},
                                                           "Linux", False))
    assert f"exercises {torch} are written in it" in problems
    rows = [result([ran("a"), ran("b", "skipped", skip_reason="no CUDA GPU"), FINISH], n) for n in ("06", "09")]
    assert f"to test {stages} compiled" in " ".join(summary(rows, "exercises/").split())


GOLDEN = Path(__file__).with_name("grader_golden_report.txt")


def test_the_report_matches_its_golden_file():
    """Pins the report's look; after a deliberate change: KATA_UPDATE_GOLDEN=1 pytest tests/kata."""
    rows = [result([ran("a"), ran("b", given=True), FINISH], "01"),
            result([ran("test_ragged[nq5-nk7-bq2-bk3-causal]", "failed", error=error(LONG),
                        about="acc not rescaled when m grows"), ran("b"), FINISH], "02"),
            result([ran("a", "failed", error=error("not started: f: replace this line", not_implemented=True)),
                    FINISH], "03"),
            result([ran("a", "error", phase="setup", error=error("SyntaxError: invalid syntax")), FINISH], "04"),
            result([{"event": "start", "nodeid": "t::test_io[n7]"}], "05", killed_after=60.0),
            result([ran("a"), ran("b", "skipped", skip_reason="needs a CUDA GPU"), FINISH], "06"),
            result([ran("a", not_checked=["07's loop order: not checked, k converted"]), FINISH], "07")]
    text = summary(rows, "exercises/") + "\n\n" + details(rows[1]) + "\n\n" + details(rows[6]) + "\n"
    if os.environ.get("KATA_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), f"the report changed; compare with {GOLDEN.name}"


@pytest.mark.parametrize("versions, system, cuda, expected", [
    ({"numpy": "2.4.1", "triton": "3.6.0", "torch": "2.11.0"}, "Linux", False, "numpy<2.4"),
    ({"numpy": "2.4.1", "triton": "3.6.0", "torch": "2.11.0"}, "Linux", True, None),  # compiled: no interpreter
    ({"numpy": "2.3.5", "triton": "3.6.0", "torch": "2.11.0"}, "Linux", False, None),
    ({"numpy": "2.4.1", "triton": None, "torch": "2.13.0"}, "Darwin", False, "the others still work"),
    ({"numpy": "2.4.1", "triton": None, "torch": "2.13.0"}, "Linux", False, "Triton is missing"),
    ({"numpy": None, "triton": "3.9.0", "torch": "2.13.0"}, "Linux", False, "NumPy is missing"),
], ids=["interpreter-numpy-2.4", "compiled", "numpy-2.3", "macos", "linux-no-triton", "no-numpy"])
def test_doctor_names_known_bad_combinations(versions, system, cuda, expected):
    """A combination that breaks 06 named with its fix, and no false alarm on a working one."""
    from kata.grader.doctor import known_problems
    texts = " | ".join(text for _, text in known_problems(versions, system, cuda))
    assert (expected in texts) if expected else texts == ""


@pytest.mark.parametrize("skip_reason, next_step", [
    ("no CUDA GPU", "Every exercise passes on the CPU. On a machine with a CUDA GPU, run"),
    ("tests the interpreter: compiled, bfloat16 works", "Every exercise passes. Time your kernels with"),
], ids=["cpu", "gpu"])
def test_the_last_step_asks_for_a_gpu_run_only_where_the_gpu_tests_were_skipped(skip_reason, next_step):
    """On a GPU the interpreter's own tests skip: the GPU stage has run, so the next step is the
    benchmark, not another run on a GPU."""
    rows = [result([ran("a"), FINISH], "01"),
            result([ran("a"), ran("b", "skipped", skip_reason=skip_reason), FINISH], "06")]
    assert next_step in summary(rows, "solutions/")


def test_a_gpu_torch_cannot_use_is_named_in_the_report():
    """nvidia-smi sees a GPU but torch cannot use it: the report says so and names the fix, in full."""
    why = ("nvidia-smi sees Tesla T4, but torch 2.13.0 is a CPU build. Fix: install a CUDA build of torch in "
           "this environment (https://pytorch.org/get-started/locally/ gives the command)")
    rows = [result([ran("a"), FINISH], "01"),
            result([ran("a"), ran("b", "skipped", skip_reason=why), FINISH], "06")]
    text = summary(rows, "exercises/")
    assert "the GPU tests were skipped:" in text and "Fix: install a CUDA build of torch" in " ".join(text.split())
    assert max(map(len, text.splitlines())) <= 80, text


@pytest.mark.skipif(not launch.can_fork(), reason="no fork server without fork (Windows)")
@pytest.mark.parametrize("test_body, server_goes, code", [
    ("pass", True, 0), ("assert False", True, 1), ("os._exit(7)", False, 7),
    ("threading.Thread(target=time.sleep, args=(60,)).start()", True, None)])
def test_a_forked_run_keeps_its_exit_code_when_the_fork_server_goes(tmp_path, test_body, server_goes, code):
    """multiprocessing reads a forked process's exit status from the fork server, and says 255 at once
    when the server has gone, the process still running: a correct solution's trial was rejected so
    ("error (pytest exit 255): 56 passed"). The code is pytest's; a process that sends none (os._exit
    in a test) gets the server's word for it; one that has not ended (a thread it waits for) is ended
    at its time limit, not taken for done (code None: killed)."""
    started = tmp_path / "started"
    test = tmp_path / "test_slow.py"
    test.write_text(f"import os, threading, time\nfrom pathlib import Path\n\n\ndef test_slow():\n"
                    f"    Path({str(started)!r}).touch()\n    time.sleep(1)\n    {test_body}\n")
    ran = {}
    thread = threading.Thread(target=lambda: ran.update(result=run_pytest(
        [str(test), "-q", "-p", "no:cacheprovider"], 120 if code is not None else 5, True, process_environment())))
    thread.start()
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    if server_goes:
        os.kill(forkserver._forkserver._forkserver_pid, signal.SIGKILL)
    thread.join(120)
    returncode, output, killed, _ = ran["result"]
    assert killed == (code is None) and (code is None or returncode == code), (returncode, killed, output)


@pytest.mark.parametrize("gpu", [False, True], ids=["CPU", "NVIDIA GPU"])
def test_a_gpu_stage_gets_the_time_its_kernels_compile_in(monkeypatch, gpu):
    """On an NVIDIA GPU a GPU stage's tests compile every kernel, the autotuned ones once a config (14's,
    cold, ran over 240 s on an H100, where the limit was 300 s): their file gets 30 times --timeout there,
    10 times in the interpreter; one test keeps half the interpreter's, so a hang is still caught soon."""
    monkeypatch.setattr(runner, "has_nvidia_gpu", lambda: gpu)
    stage, plain = find("14"), find("05")
    assert runner.timeout_for(stage, 30.0) == (900.0 if gpu else 300.0)
    assert runner.per_test_timeout(stage, 30.0) == 150.0
    assert (runner.timeout_for(plain, 30.0), runner.per_test_timeout(plain, 30.0)) == (30.0, 15.0)
