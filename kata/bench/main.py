"""`python grader.py --bench [paper | decode | sparse | train] [flags]`: which benchmark runs, each its own module."""
from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Callable

from kata.bench import decode, forward, paper, sparse, train
from kata.bench.common import ColumnError


def main(target: Path, argv: list[str], passes: Callable[[str], bool] = lambda number: False) -> int:
    """The benchmark named first in `argv` (`paper`, `decode`, `sparse`, `train`), else the forward one, given the rest;
    1 when a column has a bug, after its traceback (where to fix it) and the column's name. passes(number):
    whether the learner's exercise `number` passes its tests as it is now (train runs on its kernel then)."""
    named = {"paper": paper, "decode": decode, "sparse": sparse, "train": train}.get(argv[0] if argv else "")
    try:
        if named is train:
            return train.main(target, argv[1:], passes)
        return named.main(target, argv[1:]) if named else forward.main(target, argv)
    except ColumnError as err:
        traceback.print_exception(err.__cause__)
        print(f"\nThe benchmark stopped: {err}", file=sys.stderr)
        return 1
