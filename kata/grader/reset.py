"""`python grader.py reset 03`: put the stub back, keeping the learner's file as a backup."""
from __future__ import annotations

from pathlib import Path

from kata.exercises import SOLUTIONS_DIR, Exercise
from kata.grader.progress import BACKUP_DIR, backup_names, reason, write_whole
from kata.grader.results import display_path
from kata.grader.stub import make_stub


def reset(exercises: list[Exercise], target: Path, yes: bool = False) -> int:
    """Reset each file that differs from its stub, after one y/n question; never lose a line."""
    if target == SOLUTIONS_DIR.resolve():
        print("The solutions are not reset; reset works on your exercise files.")
        return 2
    changed = []
    for ex in exercises:
        solution = SOLUTIONS_DIR / ex.filename
        if not solution.is_file():
            print(f"{ex.number}: no {display_path(solution)} to make the stub from; skipped.")
            continue
        stub = make_stub(solution.read_text(encoding="utf-8"), ex.filename)
        path = target / ex.filename
        if not path.is_file() or path.read_text(encoding="utf-8") != stub:
            changed.append((ex, path, stub))
    if not changed:
        print("Nothing to reset: " + ", ".join(ex.number for ex in exercises)
              + (" holds" if len(exercises) == 1 else " hold") + " the untouched stub.")
        return 0
    names = ", ".join(display_path(path) for _, path, _ in changed)
    if not yes and not confirm(f"Reset {names} to the stub? Your version is kept as a backup. [y/N] "):
        return 1
    code = 0
    for ex, path, stub in changed:
        try:
            kept = _backup(ex, path)
        except OSError as error:  # without a backup the reset would lose the learner's file: refuse it
            print(f"Not reset: {display_path(path)}: its backup could not be written ({reason(error)}), and "
                  f"without one your version would be lost; nothing was changed. Make {display_path(BACKUP_DIR)}/ "
                  f"writable (or free disk space), then reset again.")
            code = 1
            continue
        try:
            write_whole(path, stub)
        except OSError as error:
            print(f"Not reset: {display_path(path)} could not be written ({reason(error)}); it is as it was.")
            code = 1
            continue
        print(f"reset {display_path(path)}" + (f"; your version is in {display_path(kept)}" if kept else ""))
    return code


def confirm(question: str) -> bool:
    try:
        answer = input(question)
    except EOFError:  # no terminal to ask (stdin closed or empty): the safe answer is no
        print("\nNo answer (nothing on standard input): nothing reset. Add --yes to reset without asking.")
        return False
    if answer.strip().lower() not in ("y", "yes"):
        print("Nothing reset.")
        return False
    return True


def _backup(ex: Exercise, path: Path) -> Path | None:
    """A copy of the learner's file under .kata/backups/, whole; OSError when none could be written."""
    if not path.is_file():
        return None
    BACKUP_DIR.mkdir(parents=True, exist_ok=True)
    data = path.read_bytes()
    for kept in backup_names(ex.stem):
        try:
            out = kept.open("xb")  # exclusive: two resets in one second never share a name
        except FileExistsError:
            continue
        try:
            with out:
                out.write(data)
        except OSError:
            kept.unlink(missing_ok=True)  # half a backup is none
            raise
        return kept
