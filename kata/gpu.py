"""What the GPU here can run: bfloat16 support, an NVIDIA GPU that torch cannot use, and whether the
Triton exercises' kernels run compiled or in Triton's interpreter."""
from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

BF16_CAPABILITY = (8, 0)  # bfloat16 tensor cores arrived with Ampere (A100, RTX 30xx); a T4 is 7.5
TORCH_INSTALL = "https://pytorch.org/get-started/locally/"
NO_GPU = "no CUDA GPU"
INTERPRET = "TRITON_INTERPRET"  # Triton reads it as it loads, and as each @triton.jit function is defined


def bf16_missing(torch) -> str | None:
    """Why bfloat16 kernels cannot run on the current CUDA GPU, or None when they can."""
    capability = tuple(torch.cuda.get_device_capability())
    if capability >= BF16_CAPABILITY:
        return None
    return (f"bfloat16 needs a GPU of compute capability {BF16_CAPABILITY[0]}.{BF16_CAPABILITY[1]} or newer; "
            f"{torch.cuda.get_device_name()} is {capability[0]}.{capability[1]}")


def out_of_memory(error: BaseException) -> str | None:
    """One line for a GPU that ran out of memory (torch's OutOfMemoryError, or Triton's launch error),
    or None for any other error. The GPU is shared: pytest -n's workers and other programs hold
    memory too, so the line says how to tell their share from the code's own."""
    line = next((line for line in str(error).splitlines() if "out of memory" in line.lower()), None)
    if line is None:
        return None
    said = ". ".join(line.strip().split(". ")[:3]).rstrip(".")  # torch's: what it asked for, what was free
    return (f"the GPU ran out of memory ({said}). Other processes on the card hold memory too, pytest -n's "
            f"workers among them: rerun this test alone before reading it as a bug in the code under test.")


def nvidia_gpus() -> list[str]:
    """The GPUs `nvidia-smi -L` lists by name; [] without nvidia-smi, or when it fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        listing = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=15).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.split(":", 1)[1].split("(UUID")[0].strip() for line in listing.splitlines()
            if line.startswith("GPU ") and ":" in line]


@functools.cache
def has_nvidia_gpu() -> bool:
    """Whether nvidia-smi lists a GPU, asked once a process."""
    return bool(nvidia_gpus())


def unusable_gpu(torch_version: str, torch_cuda: str | None, cuda_available: bool, gpus: list[str]) -> str | None:
    """Why torch cannot use the NVIDIA GPU that nvidia-smi sees, with the fix; None when there is no
    such GPU or torch can use it. `torch_cuda` is torch.version.cuda: None for a CPU build."""
    if cuda_available or not gpus:
        return None
    if torch_cuda is None:
        return (f"nvidia-smi sees {gpus[0]}, but torch {torch_version} is a CPU build. Fix: install a CUDA "
                f"build of torch in this environment ({TORCH_INSTALL} gives the command)")
    return (f"nvidia-smi sees {gpus[0]}, but torch {torch_version}, built for CUDA {torch_cuda}, cannot use it: "
            f"the NVIDIA driver is likely older than CUDA {torch_cuda} needs. Fix: update the driver, or "
            f"install a torch built for an older CUDA ({TORCH_INSTALL})")


def gpu_skip_reason(torch) -> str:
    """Why GPU-only tests are skipped here: the plain reason, or what stops torch using the GPU."""
    why = unusable_gpu(torch.__version__, torch.version.cuda, torch.cuda.is_available(), nvidia_gpus())
    return why or NO_GPU


def triton_missing() -> str | None:
    """Why Triton cannot run here, or None when it can be imported."""
    try:
        if importlib.util.find_spec("triton") is not None:
            return None
    except (ImportError, ValueError):  # a broken install, or one hidden from this Python
        pass
    return "Triton needs Linux" if not sys.platform.startswith("linux") else "Triton is not installed"


@dataclass(frozen=True)
class TritonMode:
    """How the Triton exercises' kernels run: `interpreted` or compiled, and why, in a sentence's words."""
    interpreted: bool
    why: str

    @property
    def label(self) -> str:
        return "in Triton's interpreter on the CPU" if self.interpreted else "compiled on the GPU"


def triton_mode(cuda_usable: bool, exported: str | None) -> TritonMode:
    """Compiled when torch can use a CUDA GPU, else interpreted, whatever TRITON_INTERPRET says
    (`exported`: its value here, None when unset). The tests put their tensors where the kernels
    run: interpreted kernels on a GPU's tensors, or compiled ones on the CPU's, test neither mode."""
    asked = exported not in (None, "", "0")
    if cuda_usable:
        return TritonMode(False, "torch can use a CUDA GPU" + (
            f"; {INTERPRET}={exported}, exported in this shell, is overridden: the GPU stage runs compiled"
            if asked else ""))
    return TritonMode(True, NO_GPU + (f"; {INTERPRET}={exported}, exported in this shell, is honoured" if asked else ""))


_DECIDED: TritonMode | None = None  # this process's mode, once use_triton_mode has decided it


def use_triton_mode(torch) -> TritonMode:
    """This process's mode, decided (triton_mode) at the first call and the same at every later one,
    put in os.environ (TRITON_INTERPRET=1, or unset) at each for Triton to load in and each
    @triton.jit function to be defined in. Call it before Triton is imported: Triton keeps the mode
    it loaded in, so a later call (the benchmark's, after the tests') must not decide otherwise."""
    global _DECIDED
    if _DECIDED is None:
        _DECIDED = triton_mode(torch.cuda.is_available(), os.environ.get(INTERPRET))
    if _DECIDED.interpreted:
        os.environ[INTERPRET] = "1"
    else:
        os.environ.pop(INTERPRET, None)
    return _DECIDED
