"""`python grader.py doctor`: versions, platform, GPU, a tiny Triton kernel, and known-bad combinations."""
from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from importlib import metadata

from kata.exercises import ROOT, format_numbers, numbers_where
from kata.gpu import nvidia_gpus, unusable_gpu

PACKAGES = ["numpy", "torch", "triton", "pytest", "pytest-timeout", "tabulate"]
KERNEL_TIMEOUT = 180  # seconds: importing torch and Triton and compiling one kernel

def version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _triton_exercises() -> str:
    """The exercises with a GPU stage: they need Triton, and a GPU to run compiled."""
    return format_numbers(numbers_where("needs_gpu"))


def _release(text: str | None) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text or "")[:2])


def known_problems(versions: dict[str, str | None], system: str, cuda: bool, probe: dict | None = None,
                   gpus: list[str] | None = None) -> list[tuple[str, str]]:
    """Each known-bad combination present here, with its fix: ("problem" or "note", text).

    `probe` is what the probe kernel's process reported; `gpus` what nvidia-smi lists.
    """
    problems = []
    numpy, triton, torch = versions.get("numpy"), versions.get("triton"), versions.get("torch")
    if numpy is None:
        problems.append(("problem", "NumPy is missing and every exercise needs it: pip install -r requirements.txt"))
    if torch is None:
        problems.append(("problem", f"torch is missing: exercises {format_numbers(numbers_where('needs_torch'))} "
                                    "are written in it, and some tests check against it: "
                                    "pip install -r requirements.txt"))
    if triton is None and system != "Linux":
        problems.append(("note", f"Triton runs on Linux only: exercises {_triton_exercises()} are skipped here, "
                                 "the others still work"))
    elif triton is None:
        problems.append(("problem", f'Triton is missing: pip install "triton>=3.7"; until then exercises '
                                    f'{_triton_exercises()} are skipped'))
    elif _release(triton) == (3, 6) and _release(numpy) >= (2, 4) and not cuda:
        problems.append(("problem", 'Triton 3.6\'s interpreter fails with NumPy >= 2.4: pip install "numpy<2.4" '
                                    "(or upgrade Triton: pip install -U triton)"))
    if probe and torch and (why := unusable_gpu(torch, probe.get("torch_cuda"), cuda, gpus or [])):
        problems.append(("problem", f"{why}; until then the GPU tests of {_triton_exercises()} are skipped"))
    if probe and probe.get("bf16_missing"):
        problems.append(("note", f"{probe['bf16_missing']}: the bfloat16 tests of {_triton_exercises()}, and the "
                                 "benchmarks (all bfloat16), are skipped; float16 and float32 run"))
    return problems


def probe_kernel() -> dict:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    try:
        done = subprocess.run([sys.executable, "-m", "kata.grader.triton_probe"], capture_output=True, text=True,
                              timeout=KERNEL_TIMEOUT, env=env, stdin=subprocess.DEVNULL, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"ok": False, "cuda": False, "error": f"no answer after {KERNEL_TIMEOUT} s"}
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("KATA-PROBE ")), None)
    if line is None:
        tail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return {"ok": False, "cuda": False, "error": f"the probe process died: {tail}"}
    return json.loads(line.removeprefix("KATA-PROBE "))


def main() -> int:
    versions = {name: version(name) for name in PACKAGES}
    print(f"{'Python':<15} {platform.python_version()} ({sys.executable})")
    for name, found in versions.items():
        print(f"{name:<15} {found or 'not installed'}")
    print(f"{'platform':<15} {platform.system()} {platform.release()} ({platform.machine()})")
    probe = probe_kernel() if versions["torch"] else None
    cuda = bool(probe and probe.get("cuda"))
    if cuda:
        gpu = probe.get("device")
    elif probe is None:
        gpu = f"unknown: torch is needed to look ({_triton_exercises()} are skipped without it)"
    elif probe.get("triton_missing"):
        gpu = "no CUDA GPU"
    else:
        gpu = f"no CUDA GPU: {_triton_exercises()} run in Triton's interpreter on the CPU"
    print(f"{'GPU':<15} {gpu}")
    if probe is not None and not probe.get("triton_missing"):
        if probe.get("mode"):
            print(f"{'Triton mode':<15} {probe['mode']}: {probe['why']}")
        state = "works" if probe["ok"] else f"FAILS: {probe['error']}"
        print(f"{'Triton kernel':<15} a tiny kernel, {probe.get('mode') or 'as the Triton exercises run it'}: {state}")
    problems = known_problems(versions, platform.system(), cuda, probe, nvidia_gpus() if probe and not cuda else [])
    for kind, text in problems:
        print(f"{kind:<15} {text}")
    healthy = all(kind == "note" for kind, _ in problems) and (probe is None or probe.get("triton_missing")
                                                                or probe["ok"])
    print("All set: python grader.py" if healthy else "Fix the problems above, then run python grader.py doctor again.")
    return 0 if healthy else 1
