"""Exercises solved, for the later exercises that build on them.

    solved("04").tile_schedule     exercise 07 walks 04's schedule of tiles
    solved("06").flash_attention   exercise 09 trains through 06's fused forward
    solved("06").attn_tiles        exercise 10 folds key tiles with 06's inner loop

Each is the file in solutions/, loaded once as a module: a later exercise runs on the reference
answer of an earlier one, never on your copy of it, so a bug there cannot show up here. One
exception, asked for: `python grader.py train` runs 15 on your own 13 and 14 once they pass
(run_on_yours), since training a model with your kernels is the point of it.
"""
from functools import cache
from types import ModuleType

from kata.exercises import SOLUTIONS_DIR, Exercise, find, load

PREFIX = "kata_solved"  # the module names of solved exercises: kata_solved_06_triton_kernel
_YOURS: dict[Exercise, ModuleType] = {}  # the learner's modules that solved() gives instead, in this process


def solved(key: str) -> ModuleType:
    """Exercise `key` ("04", "06", ...) as solved in solutions/, or as run_on_yours set it."""
    exercise = find(key)
    return _YOURS.get(exercise) or _loaded(exercise)


def run_on_yours(key: str, module: ModuleType) -> None:
    """From now on in this process, solved(key) is `module`, the learner's passing exercise: set it
    before loading the exercise that builds on it, which takes solved(key)'s names as it loads."""
    _YOURS[find(key)] = module


@cache
def _loaded(exercise: Exercise) -> ModuleType:
    return load(exercise, SOLUTIONS_DIR, prefix=PREFIX)
