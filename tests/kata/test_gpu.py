"""GPUs the kata cannot fully use, faked: no bfloat16 (compute capability < 8.0), and an NVIDIA GPU
that torch cannot use (a CPU build of torch, or a driver too old for its CUDA)."""
import importlib
import json
import os
import stat
import subprocess
import sys
from types import SimpleNamespace

import pytest

from kata import gpu
from kata.bench import forward as bench
from kata.grader import doctor
from kata.exercises import ROOT, SOLUTIONS_DIR, format_numbers, numbers_where

T4 = "Tesla T4"


def fake_torch(capability=(7, 5), available=True, cuda="12.4"):
    return SimpleNamespace(__version__="2.13.0", version=SimpleNamespace(cuda=cuda), cuda=SimpleNamespace(
        is_available=lambda: available, get_device_capability=lambda *a: capability,
        get_device_name=lambda *a: T4))


def fake_nvidia_smi(tmp_path, monkeypatch, listing=f"GPU 0: {T4} (UUID: GPU-1234)\n"):
    """An `nvidia-smi` first on PATH that lists one GPU."""
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\nprintf '{listing}'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_bf16_needs_compute_capability_8():
    """A T4 (7.5) has no bfloat16 tensor cores: named with its capability; an A100 (8.0) has them."""
    assert gpu.bf16_missing(fake_torch((7, 5))) == (
        "bfloat16 needs a GPU of compute capability 8.0 or newer; Tesla T4 is 7.5")
    assert gpu.bf16_missing(fake_torch((8, 0))) is None


def test_06_skips_bf16_cases_with_the_reason(monkeypatch):
    """On a T4 the bf16 cases of 06 are skipped with the reason, not failed at compile time."""
    test_06 = importlib.import_module("test_06_triton_kernel")
    monkeypatch.setattr(test_06.torch.cuda, "get_device_capability", lambda *a: (7, 5))
    monkeypatch.setattr(test_06.torch.cuda, "get_device_name", lambda *a: T4)
    with pytest.raises(pytest.skip.Exception, match="compute capability 8.0 or newer; Tesla T4 is 7.5"):
        test_06.skip_unless_supported("bf16")
    assert test_06.skip_unless_supported("f16") == test_06.torch.float16


def test_bench_skips_every_bf16_cell_with_the_reason(monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    if why := gpu.triton_missing():
        pytest.skip(why)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: T4)
    assert bench.main(SOLUTIONS_DIR, ["--no-plot"]) == 2
    out = capsys.readouterr().out
    assert "all are skipped: bfloat16 needs a GPU of compute capability 8.0" in out and "Nothing was measured" in out


def test_nvidia_smi_listing_is_read(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, f"GPU 0: {T4} (UUID: GPU-1)\\nGPU 1: NVIDIA A100 (UUID: GPU-2)\\n")
    assert gpu.nvidia_gpus() == [T4, "NVIDIA A100"]


@pytest.mark.parametrize("torch_cuda, words", [(None, "is a CPU build. Fix: install a CUDA build"),
                                               ("12.8", "built for CUDA 12.8, cannot use it: the NVIDIA driver")],
                         ids=["cpu-build", "old-driver"])
def test_a_gpu_torch_cannot_use_is_named_with_the_fix(tmp_path, monkeypatch, torch_cuda, words):
    """nvidia-smi sees a GPU, torch does not: 40 GPU tests silently skipped, unless the reason says why."""
    fake_nvidia_smi(tmp_path, monkeypatch)
    reason = gpu.gpu_skip_reason(fake_torch(available=False, cuda=torch_cuda))
    assert reason.startswith(f"nvidia-smi sees {T4}, but torch 2.13.0") and words in reason
    problems = doctor.known_problems({"numpy": "2.4", "torch": "2.13.0", "triton": "3.9"}, "Linux", False,
                                     probe={"cuda": False, "torch_cuda": torch_cuda}, gpus=gpu.nvidia_gpus())
    stages = format_numbers(numbers_where("needs_gpu"))
    assert ("problem", f"{reason}; until then the GPU tests of {stages} are skipped") in problems


def test_no_gpu_or_a_working_one_is_no_problem(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi at all
    assert gpu.gpu_skip_reason(fake_torch(available=False, cuda=None)) == "no CUDA GPU"
    assert gpu.unusable_gpu("2.13.0", "12.8", True, [T4]) is None


def test_doctor_notes_a_gpu_without_bf16():
    problems = doctor.known_problems({"numpy": "2.4", "torch": "2.13.0", "triton": "3.9"}, "Linux", True,
                                     probe={"cuda": True, "bf16_missing": gpu.bf16_missing(fake_torch())})
    stages = format_numbers(numbers_where("needs_gpu"))
    assert any(kind == "note" and f"the bfloat16 tests of {stages}, and the benchmarks" in text
               for kind, text in problems)


@pytest.fixture
def undecided(monkeypatch):
    """This process's Triton mode not yet decided; after the test, the decision and TRITON_INTERPRET
    as they were (the exercise tests that follow in this process rely on both)."""
    before = os.environ.get(gpu.INTERPRET)
    monkeypatch.setattr(gpu, "_DECIDED", None)
    yield
    os.environ.pop(gpu.INTERPRET, None)
    if before is not None:
        os.environ[gpu.INTERPRET] = before


@pytest.mark.parametrize("cuda, exported, interpreted, words", [
    (True, None, False, "torch can use a CUDA GPU"),
    (True, "1", False, "TRITON_INTERPRET=1, exported in this shell, is overridden"),
    (False, None, True, "no CUDA GPU"),
    (False, "1", True, "TRITON_INTERPRET=1, exported in this shell, is honoured"),
    (False, "0", True, "no CUDA GPU"),
], ids=["gpu", "gpu-exported", "cpu", "cpu-exported", "cpu-exported-0"])
def test_kernels_run_compiled_exactly_where_a_gpu_is_usable(undecided, cuda, exported, interpreted, words):
    """One decision for the tests, kata/given and doctor, whatever the shell exported: with
    TRITON_INTERPRET=1 kept on a GPU the interpreter ran on CUDA tensors while the tests and the given
    launch code took it for compiled (NaN from l = 0), and doctor said "compiled on the GPU: works"."""
    os.environ.pop(gpu.INTERPRET, None)
    if exported is not None:
        os.environ[gpu.INTERPRET] = exported
    mode = gpu.use_triton_mode(fake_torch((9, 0), available=cuda))
    assert mode.interpreted == interpreted and os.environ.get(gpu.INTERPRET) == ("1" if interpreted else None)
    if not gpu.triton_missing():
        from kata.given import launch
        assert launch.interpreted() == interpreted
    assert words in mode.why and mode.label == ("in Triton's interpreter on the CPU" if interpreted
                                                else "compiled on the GPU")
    os.environ[gpu.INTERPRET] = "1"
    assert gpu.use_triton_mode(fake_torch((9, 0), available=not cuda)) == mode  # decided once a process
    assert os.environ.get(gpu.INTERPRET) == ("1" if interpreted else None)


GPU_WITH_THE_VARIABLE = """
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, "tests")
import torch
torch.cuda.is_available = lambda: True
torch.cuda.get_device_name = lambda *a: "NVIDIA H200"
torch.cuda.get_device_capability = lambda *a: (9, 0)
import triton_helpers
from kata.given import launch, tiles
from kata.grader.triton_probe import probe
seen = dict(device=triton_helpers.DEVICE, interpreted=triton_helpers.INTERPRETED, given=launch.interpreted(),
            variable=os.environ.get("TRITON_INTERPRET"), jit=type(tiles.row_ptrs).__name__)
os.environ["TRITON_INTERPRET"] = "1"  # as doctor's probe process finds it
print(json.dumps(dict(seen, probe=probe())))
"""


def test_a_gpu_with_the_variable_exported_runs_compiled_everywhere():
    """On a (faked) GPU with TRITON_INTERPRET=1 exported: the tests' device, kata/given's launch code,
    Triton itself and doctor's probe all run compiled, the probe saying the variable was overridden."""
    torch = pytest.importorskip("torch")
    if why := gpu.triton_missing():
        pytest.skip(why)
    if torch.cuda.is_available():
        pytest.skip("a real GPU is here, which the faked one would shadow: python grader.py doctor shows the mode")
    done = subprocess.run([sys.executable, "-c", GPU_WITH_THE_VARIABLE], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert (seen["device"], seen["interpreted"], seen["given"], seen["variable"], seen["jit"]) == (
        "cuda", False, False, None, "JITFunction")
    probe = seen["probe"]
    assert probe["mode"] == "compiled on the GPU" and "TRITON_INTERPRET=1, exported in this shell, is overridden" in \
        probe["why"]
    assert not probe["ok"] and "loaded" not in probe["error"]  # got as far as CUDA tensors: there is no GPU here


TRITON_FIRST = """
import json, sys
sys.path.insert(0, "tests")
import conftest  # noqa: F401  as pytest loads it, before any test file
import triton  # noqa: F401  a test file that imports Triton before triton_helpers
import triton_helpers
import triton.language as tl
print(json.dumps([type(tl.cdiv).__name__ == "InterpretedFunction", triton_helpers.INTERPRETED]))
"""


def test_triton_imported_before_triton_helpers_still_loads_in_the_decided_mode():
    """A test file that imports Triton first (an importorskip at its top) loaded it compiled on the
    CPU, as the variable, not yet set, said: Triton's own @triton.jit functions (tl.cdiv) stayed
    compiled, and every kernel of the run after it failed ("Cannot call @triton.jit'd outside of the
    scope of a kernel")."""
    pytest.importorskip("torch")
    if why := gpu.triton_missing():
        pytest.skip(why)
    env = {k: v for k, v in os.environ.items() if k != gpu.INTERPRET}
    done = subprocess.run([sys.executable, "-c", TRITON_FIRST], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded_interpreted, tests_interpreted = json.loads(done.stdout.splitlines()[-1])
    assert loaded_interpreted == tests_interpreted


@pytest.mark.parametrize("error, said", [
    (RuntimeError("Triton Error [CUDA]: out of memory"), "the GPU ran out of memory (Triton Error [CUDA]: out of memory)"),
    (RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API "
                  "call, so the stacktrace below might be incorrect."), "the GPU ran out of memory (CUDA error: out of memory)"),
    (ValueError("q must be 4-D"), None),
])
def test_only_an_out_of_memory_error_is_read_as_one(error, said):
    """Triton's launch says it in other words than torch's allocator; an error of the code's own stays its own."""
    line = gpu.out_of_memory(error)
    assert (line if line is None else line.split(". Other")[0]) == said


@pytest.mark.parametrize("initialized, emptied", [(True, 1), (False, 0)])
def test_each_test_gives_its_gpu_memory_back(monkeypatch, initialized, emptied):
    """pytest -n 8 on one card: torch's caching allocator kept a finished test's 20 GiB in one worker
    and the others ran out of memory. After each test the cache goes back, where CUDA is in use."""
    import conftest
    calls = []
    cuda = SimpleNamespace(is_initialized=lambda: initialized, empty_cache=lambda: calls.append("empty_cache"))
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))
    teardown = conftest.pytest_runtest_teardown(None)
    next(teardown)  # pytest's own teardown runs here: the test's fixtures go
    calls.append("fixtures gone")
    with pytest.raises(StopIteration):
        teardown.send(None)
    assert calls == ["fixtures gone"] + ["empty_cache"] * emptied
