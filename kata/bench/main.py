"""`python grader.py --bench [paper | decode] [flags]`: which benchmark runs, each its own module."""
from __future__ import annotations

from pathlib import Path

from kata.bench import decode, forward, paper


def main(target: Path, argv: list[str]) -> int:
    """The benchmark named first in `argv` (`paper`, `decode`), else the forward one, given the rest."""
    named = {"paper": paper, "decode": decode}.get(argv[0] if argv else "")
    return named.main(target, argv[1:]) if named else forward.main(target, argv)
