"""What an untouched exercise file is: its solution with each marked block replaced by a stub line.

A solution marks the code the learner writes:

        # BEGIN SOLUTION
        m = x.max(axis=-1, keepdims=True)
        ...
        # END SOLUTION

The exercise file is the same text with each marked block replaced by one line,
`raise NotImplementedError(...)`, at the block's indentation.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from kata.exercises import SOLUTIONS_DIR, Exercise

BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
_DEF = re.compile(r"^(\s*)def (\w+)\(")


def _enclosing_function(lines: list[str], indent: int) -> str:
    for line in reversed(lines):
        match = _DEF.match(line)
        if match and len(match.group(1)) < indent:
            return match.group(2)
    raise ValueError("a solution block must sit inside a function")


@dataclass(frozen=True)
class Stub:
    text: str
    todos: list[tuple[int, str]]  # each stub line: its line number in `text`, and its function


def build(solution: str, filename: str = "<solution>") -> Stub:
    """The exercise text for a solution text, and where its stub lines are."""
    out: list[str] = []
    todos: list[tuple[int, str]] = []
    inside = None  # line number of the open BEGIN marker
    for number, line in enumerate(solution.splitlines(keepends=True), start=1):
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise ValueError(f"{filename}:{number}: {BEGIN} inside the block opened on line {inside}")
            inside = number
            indent = len(line) - len(line.lstrip())
            todos.append((len(out) + 1, _enclosing_function(out, indent)))
            out.append(f"{' ' * indent}raise NotImplementedError(\"{todo_message(todos[-1][1])}\")\n")
        elif stripped == END:
            if not inside:
                raise ValueError(f"{filename}:{number}: {END} without {BEGIN}")
            inside = None
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{filename}:{inside}: {BEGIN} is never closed")
    return Stub("".join(out), todos)


def make_stub(solution: str, filename: str = "<solution>") -> str:
    """The exercise text for a solution text."""
    return build(solution, filename).text


def todo_message(function: str) -> str:
    """What a stub line's NotImplementedError says."""
    return f"{function}: replace this line with your code"


def stub_of(exercise: Exercise) -> Stub | None:
    """The untouched exercise file, or None when there is no solution to make it from."""
    path = SOLUTIONS_DIR / exercise.filename
    return build(path.read_text(encoding="utf-8"), exercise.filename) if path.is_file() else None


def stub_for(exercise: Exercise) -> str | None:
    """The untouched exercise file's text, or None when there is no solution to make it from."""
    stub = stub_of(exercise)
    return stub.text if stub else None
