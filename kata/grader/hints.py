"""Progressive hints: `python grader.py hint 03` shows one more `## Hint N` section each call."""
from __future__ import annotations

import re
from pathlib import Path

from kata.exercises import Exercise
from kata.grader.progress import Progress
from kata.grader.results import display_path

_HEADING = re.compile(r"^## Hint (\d+)\s*$", re.MULTILINE)


def sections(path: Path) -> list[str]:
    """The text of each `## Hint N` section, in order."""
    text = path.read_text(encoding="utf-8")
    starts = list(_HEADING.finditer(text))
    ends = [m.start() for m in starts[1:]] + [len(text)]
    return [text[m.end():end].strip() for m, end in zip(starts, ends)]


def show(exercise: Exercise, show_all: bool = False, progress: Progress | None = None) -> tuple[str, int]:
    """The text to print and the exit code: the next unread hint (or all of them)."""
    if not exercise.hint_file.is_file():
        return f"No hints for {exercise.number}: {display_path(exercise.hint_file)} is missing.", 1
    hints = sections(exercise.hint_file)
    if not hints:
        return f"No hints for {exercise.number}: {display_path(exercise.hint_file)} has no '## Hint 1' section.", 1
    progress = progress or Progress()
    read = min(progress.hints_read(exercise.number), len(hints))
    if show_all:
        progress.set_hints_read(exercise.number, len(hints))
        return "\n\n".join(_one(exercise, i, hints) for i in range(len(hints))), 0
    if read >= len(hints):
        return (f"No more hints for {exercise.number}: you have read all {len(hints)}.\n"
                f"See them again: python grader.py hint {exercise.number} --all"), 0
    progress.set_hints_read(exercise.number, read + 1)
    more = (f"Another hint: python grader.py hint {exercise.number}" if read + 1 < len(hints)
            else "That was the last hint.")
    return f"{_one(exercise, read, hints)}\n\n{more}", 0


def _one(exercise: Exercise, index: int, hints: list[str]) -> str:
    return f"Hint {index + 1} of {len(hints)} for {exercise.number} {exercise.name}\n\n{hints[index]}"
