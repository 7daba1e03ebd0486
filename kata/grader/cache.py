"""Results kept under .kata/cache/, keyed by everything that can change a verdict: an unchanged
exercise is not run again.

The key covers the learner's file, its test file and the tests' helpers, the grader's own code,
pytest.ini, the time limit, the versions of Python and the packages (torch's names its CUDA build),
the GPU (whether one is there, which, and its driver: they decide whether the kernels run compiled
or interpreted, and which tests skip), and the environment variables the tests read. The kata's
own folders (exercises/, solutions/) are cached; any other --target folder, and fresh random
inputs, are always run.
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import json
import os
import platform
import shutil
import sys
from pathlib import Path

from kata.exercises import EXERCISES_DIR, ROOT, SOLUTIONS_DIR, TESTS_DIR, Exercise, find
from kata.gpu import nvidia_gpus
from kata.grader.doctor import PACKAGES, version
from kata.grader.progress import STATE_DIR, keep
from kata.grader.results import ExerciseResult, Failure, TestResult

CACHE_DIR = STATE_DIR / "cache"
# KATA_SEED, KATA_FRESH_SEEDS, ...: what the tests draw and how; TRITON_ and TORCH_ variables change
# how kernels compile and multiply (TRITON_F32_DEFAULT, TORCH_ALLOW_TF32_CUBLAS_OVERRIDE), and
# TRITON_INTERPRET what the mode's decision says of it.
ENV_PREFIXES = ("KATA_", "TRITON_", "TORCH_")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_TF32_OVERRIDE")  # on which GPU; cuBLAS's TF32 switch
GPU_DEVICES = ("/dev/nvidia[0-9]*", "/dev/dxg", "/dev/kfd")  # the NVIDIA driver's GPUs, WSL's, ROCm's
DRIVER_VERSION = Path("/proc/driver/nvidia/version")  # the NVIDIA driver's, on Linux


def enabled(target: Path) -> bool:
    """Other folders (mutants, trial copies) come and go; fresh seeds must meet new inputs."""
    return target in (EXERCISES_DIR.resolve(), SOLUTIONS_DIR.resolve()) and os.environ.get("KATA_FRESH_SEEDS") != "1"


def key(exercise: Exercise, target: Path, limit: float, learner: bytes) -> str:
    """The key of one run: `learner` is the bytes of the file under test, read once by the caller."""
    digest = hashlib.sha256(_shared())
    for part in (str(target), repr(limit), *_environment()):
        digest.update(part.encode() + b"\0")
    digest.update(_read(exercise.test_file) + b"\0" + learner)
    return digest.hexdigest()


def load(exercise: Exercise, target: Path, run_key: str) -> ExerciseResult | None:
    entry = _entry(exercise, target)
    if entry is None or entry.get("key") != run_key:
        return None
    try:
        return dataclasses.replace(_from_json(entry["result"]), cached=True)
    except (KeyError, TypeError, LookupError):  # a result written by another version of the grader
        return None


def store(result: ExerciseResult, target: Path, run_key: str) -> None:
    """Keep the result under its key: whole, or (.kata/ unwritable) not at all, said once."""
    keep(_entry_path(result.exercise, target), json.dumps({"key": run_key, "result": _to_json(result)}))


def last_seconds(exercise: Exercise, target: Path) -> float:
    """How long the exercise's last cached run took (0 when none): the slowest are started first."""
    entry = _entry(exercise, target)
    try:
        return float(entry["result"]["seconds"]) if entry else 0.0
    except (KeyError, TypeError, ValueError):
        return 0.0


@functools.lru_cache(maxsize=None)
def _shared() -> bytes:
    """What every exercise's key holds: the grader, the tests' helpers, pytest.ini, the versions."""
    files = [ROOT / "grader.py", ROOT / "pytest.ini", *sorted((ROOT / "kata").rglob("*.py")),
             *sorted(p for p in TESTS_DIR.glob("*.py") if not p.name.startswith("test_"))]
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + _read(path) + b"\0")
    versions = [sys.version, platform.platform(), *(f"{name}={version(name)}" for name in PACKAGES)]
    digest.update("\0".join(versions).encode())
    return digest.digest()


def _environment() -> list[str]:
    """The variables the tests read, and the GPU: they change skips and verdicts."""
    names = sorted(n for n in os.environ if n.startswith(ENV_PREFIXES) or n in ENV_NAMES)
    return [f"{n}={os.environ[n]}" for n in names] + _gpu()


@functools.lru_cache(maxsize=None)
def _gpu() -> list[str]:
    """The GPU devices the system shows, the NVIDIA GPUs by name and the driver's version: another
    GPU, or a driver that torch can (or no longer can) use, may change a verdict."""
    devices = [path for pattern in GPU_DEVICES for path in sorted(glob.glob(pattern))]
    driver = _read(DRIVER_VERSION).decode("utf-8", "replace")
    return devices + [f"nvidia-smi={shutil.which('nvidia-smi')}", *nvidia_gpus(), driver]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _entry_path(exercise: Exercise, target: Path) -> Path:
    """One entry per exercise and folder: a new result replaces the old, so the cache stays small."""
    return CACHE_DIR / f"{exercise.stem}.{target.name}.json"


def _entry(exercise: Exercise, target: Path) -> dict | None:
    try:
        entry = json.loads(_entry_path(exercise, target).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, or unreadable: run the tests
        return None
    return entry if isinstance(entry, dict) else None


def _to_json(result: ExerciseResult) -> dict:
    return {**dataclasses.asdict(result), "exercise": result.exercise.number, "path": str(result.path)}


def _from_json(data: dict) -> ExerciseResult:
    failure = data["failure"] and Failure(**data["failure"])
    return ExerciseResult(**{**data, "exercise": find(data["exercise"]), "path": Path(data["path"]),
                             "failure": failure, "tests": [TestResult(**t) for t in data["tests"]]})
