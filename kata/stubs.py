"""Make each exercise file from its solution, so the two never drift.

A solution marks the code the learner writes:

        # BEGIN SOLUTION
        m = x.max(axis=-1, keepdims=True)
        ...
        # END SOLUTION

The exercise file is the same text with each marked block replaced by one line,
`raise NotImplementedError(...)`, at the block's indentation.

    python -m kata.stubs            # check that exercises/ is what the solutions make
    python -m kata.stubs --write    # regenerate exercises/ (overwrites learner work!)
"""
from __future__ import annotations

import re
import sys

from kata.exercises import EXERCISES, EXERCISES_DIR, SOLUTIONS_DIR

BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
_DEF = re.compile(r"^(\s*)def (\w+)\(")


def _enclosing_function(lines: list[str], indent: int) -> str:
    for line in reversed(lines):
        match = _DEF.match(line)
        if match and len(match.group(1)) < indent:
            return match.group(2)
    raise ValueError("a solution block must sit inside a function")


def make_stub(solution: str, filename: str = "<solution>") -> str:
    """The exercise text for a solution text."""
    out: list[str] = []
    inside = None  # line number of the open BEGIN marker
    for number, line in enumerate(solution.splitlines(keepends=True), start=1):
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise ValueError(f"{filename}:{number}: {BEGIN} inside the block opened on line {inside}")
            inside = number
            indent = len(line) - len(line.lstrip())
            name = _enclosing_function(out, indent)
            out.append(f"{' ' * indent}raise NotImplementedError(\"{name}: replace this line with your code\")\n")
        elif stripped == END:
            if not inside:
                raise ValueError(f"{filename}:{number}: {END} without {BEGIN}")
            inside = None
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{filename}:{inside}: {BEGIN} is never closed")
    return "".join(out)


def expected_stubs() -> dict[str, str]:
    return {ex.filename: make_stub((SOLUTIONS_DIR / ex.filename).read_text(encoding="utf-8"), ex.filename)
            for ex in EXERCISES if (SOLUTIONS_DIR / ex.filename).exists()}


def main(argv: list[str]) -> int:
    stubs = expected_stubs()
    if "--write" in argv:
        for filename, text in stubs.items():
            (EXERCISES_DIR / filename).write_text(text, encoding="utf-8")
        print(f"wrote {len(stubs)} exercise files from solutions/")
        return 0
    stale = [f for f, text in stubs.items()
             if not (EXERCISES_DIR / f).exists() or (EXERCISES_DIR / f).read_text(encoding="utf-8") != text]
    stray = sorted(p.name for p in EXERCISES_DIR.glob("*.py") if p.name not in stubs)
    if stale or stray:
        if stale:
            print(f"exercises/ out of sync with solutions/: {', '.join(stale)}\n"
                  f"fix: python -m kata.stubs --write")
        if stray:
            print(f"exercises/ holds files no solution makes: {', '.join(stray)}\nfix: remove them")
        return 1
    print(f"stubs in sync: {len(stubs)} exercise files match their solutions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
