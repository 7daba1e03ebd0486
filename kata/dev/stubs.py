"""Make each exercise file from its solution (kata.grader.stub), so the two never drift.

    python -m kata.dev.stubs            # check that exercises/ is what the solutions make
    python -m kata.dev.stubs --write    # regenerate exercises/ (overwrites learner work!)
"""
from __future__ import annotations

import sys

from kata.exercises import EXERCISES, EXERCISES_DIR
from kata.grader.stub import stub_for


def expected_stubs() -> dict[str, str]:
    return {ex.filename: stub for ex in EXERCISES if (stub := stub_for(ex)) is not None}


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
                  f"fix: python -m kata.dev.stubs --write")
        if stray:
            print(f"exercises/ holds files no solution makes: {', '.join(stray)}\nfix: remove them")
        return 1
    print(f"stubs in sync: {len(stubs)} exercise files match their solutions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
