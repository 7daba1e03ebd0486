"""The exercises in order, and where the code under test comes from (the target folder)."""
from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Iterable

ROOT = Path(__file__).resolve().parent.parent
EXERCISES_DIR = ROOT / "exercises"
SOLUTIONS_DIR = ROOT / "solutions"
TESTS_DIR = ROOT / "tests"
HINTS_DIR = ROOT / "hints"


@dataclass(frozen=True)
class Exercise:
    number: str  # "01"
    name: str  # "safe_softmax"
    title: str  # one line for the report
    needs_gpu: bool = False  # a GPU stage: compiled tests need CUDA; the rest runs in Triton's interpreter
    needs_torch: bool = False  # the exercise file itself works on torch tensors
    torch_oracle: bool = False  # a NumPy exercise whose tests check it against torch's autograd

    @property
    def tests_import_torch(self) -> bool:
        return self.needs_torch or self.torch_oracle

    @property
    def stem(self) -> str:
        return f"{self.number}_{self.name}"

    @property
    def filename(self) -> str:
        return f"{self.stem}.py"

    @property
    def test_file(self) -> Path:
        return TESTS_DIR / f"test_{self.stem}.py"

    @property
    def hint_file(self) -> Path:
        return HINTS_DIR / f"{self.stem}.md"


EXERCISES = [
    Exercise("01", "safe_softmax", "softmax without overflow"),
    Exercise("02", "online_softmax", "one pass: running max and running sum"),
    Exercise("03", "merge_partials", "two partial results make one exact result"),
    Exercise("04", "tiled_attention", "attention one tile at a time"),
    Exercise("05", "io_counting", "count every element moved between HBM and SRAM"),
    Exercise("06", "triton_kernel", "the fused kernel in Triton", needs_gpu=True, needs_torch=True),
    Exercise("07", "attention_backward", "the backward pass, recomputed tile by tile", torch_oracle=True),
    Exercise("08", "backward_io", "what recomputation saves"),
    Exercise("09", "triton_backward", "train with your kernel: the backward in Triton", needs_gpu=True,
             needs_torch=True),
    Exercise("10", "flash_decoding", "split-KV decoding at the memory limit", needs_gpu=True, needs_torch=True),
    Exercise("11", "ring_attention", "attention across processes", needs_torch=True),
    Exercise("12", "block_sparse", "skip the tiles a mask empties"),
    Exercise("13", "triton_block_sparse", "the kernel that visits only the listed tiles", needs_gpu=True,
             needs_torch=True),
    Exercise("14", "attention_dropout", "dropout in the kernel, its mask regenerated in the backward",
             needs_gpu=True, needs_torch=True),
    Exercise("15", "train_gpt", "a GPT on your kernels: the attention layer, packed documents", needs_gpu=True,
             needs_torch=True),
]


def numbers_where(flag: str) -> list[str]:
    """The numbers of the exercises whose field `flag` is set: numbers_where("needs_gpu")."""
    return [ex.number for ex in EXERCISES if getattr(ex, flag)]


def format_numbers(numbers: Iterable[str]) -> str:
    """Numbers as a sentence says them: "06", "06 and 09", "06, 09 and 10"."""
    numbers = list(numbers)
    return " and ".join(filter(None, [", ".join(numbers[:-1]), *numbers[-1:]]))


def find(key: str) -> Exercise:
    """The exercise named by `key`: "3", "03", "merge_partials" or "03_merge_partials"."""
    for ex in EXERCISES:
        if key in (ex.number, ex.number.lstrip("0"), ex.name, ex.stem, ex.filename):
            return ex
    names = ", ".join(ex.number for ex in EXERCISES)
    raise LookupError(f"no exercise {key!r}: choose one of {names}")


def resolve_target(solutions: bool = False, target: str | os.PathLike | None = None) -> Path:
    """The folder whose files are tested: --target, else --solutions, else $KATA_TARGET, else exercises/."""
    if target is not None:
        path = Path(target)
    elif solutions:
        path = SOLUTIONS_DIR
    elif os.environ.get("KATA_TARGET"):
        path = Path(os.environ["KATA_TARGET"])
    else:
        path = EXERCISES_DIR
    path = path.expanduser().resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"target folder {path} does not exist")
    return path


def is_solutions(target: Path) -> bool:
    """Whether `target` is solutions/, the reference answers."""
    return target.resolve() == SOLUTIONS_DIR


def load(exercise: Exercise, target: Path, prefix: str = "kata_target") -> ModuleType:
    """Import the exercise's file from `target` as a fresh module (its name starts with a digit), named
    `prefix`_NN_name: a solved exercise that a later one builds on (kata.given.solved) takes another
    prefix, so that it never replaces the learner's module of the same exercise."""
    path = target / exercise.filename
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the target folder must hold {exercise.filename}")
    if str(ROOT) not in sys.path:  # exercise files may import kata.given.hbm
        sys.path.insert(0, str(ROOT))
    module_name = f"{prefix}_{exercise.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # Triton's @jit and dataclasses look the module up by name
    spec.loader.exec_module(module)
    return module
