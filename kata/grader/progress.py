"""The learner's state under .kata/: exercises passed, hints read, backups of reset files; and how
every file there is written (whole or not at all), and what happens when .kata/ cannot be written."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from datetime import datetime
from pathlib import Path

from kata.exercises import ROOT
from kata.grader.results import display_path

STATE_DIR = ROOT / ".kata"
BACKUP_DIR = STATE_DIR / "backups"
_UNWRITABLE = threading.Event()  # set once .kata/ has been found unwritable and the learner told
_TELLING = threading.Lock()  # the runner's threads store results at once


class Progress:
    """`.kata/progress.json`: {"passed": {"03": "2026-11-29T10:40:00"}, "hints": {"03": 2}}.

    A file that cannot be read (hand-edited, half-written) is set aside once, with a warning, and
    the kata carries on as if fresh: progress is a convenience, never a reason to stop.
    """

    def __init__(self, path: Path | None = None):
        self.path = path or STATE_DIR / "progress.json"
        self.data = {"passed": {}, "hints": {}}
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not (isinstance(data.get("passed"), dict) and isinstance(data.get("hints"), dict)):
                raise ValueError("not the kata's progress format")
            self.data = data
        except (ValueError, OSError, AttributeError) as error:
            aside = self.path.with_suffix(".json.unreadable")
            try:
                os.replace(self.path, aside)
            except OSError:
                aside = self.path
            print(f"warning: {display_path(self.path)} could not be read ({error}); starting afresh, "
                  f"the old file is kept as {display_path(aside)}", file=sys.stderr)

    def save(self) -> None:
        keep(self.path, json.dumps(self.data, indent=2, sort_keys=True))

    def has_passed(self, number: str) -> bool:
        return number in self.data["passed"]

    def mark_passed(self, numbers: list[str]) -> None:
        new = [n for n in numbers if n not in self.data["passed"]]
        for number in new:
            self.data["passed"][number] = now()
        if new:
            self.save()

    def hints_read(self, number: str) -> int:
        value = self.data["hints"].get(number, 0)
        return value if isinstance(value, int) and value >= 0 else 0

    def set_hints_read(self, number: str, count: int) -> None:
        self.data["hints"][number] = count
        self.save()


def write_whole(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all: beside it, then renamed over it, so that a killed
    run, a full disk or two graders at once never leave half a file. Raises OSError, leaving `path` as
    it was."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def keep(path: Path, text: str) -> bool:
    """write_whole for a file under .kata/. One that cannot be written (a read-only course folder, a
    full disk) costs only what it would have remembered: the learner is told once per run, and the
    grader goes on. Whether it was written."""
    try:
        write_whole(path, text)
        return True
    except OSError as error:
        with _TELLING:
            if _UNWRITABLE.is_set():
                return False
            _UNWRITABLE.set()
        print(f"note: results are not cached (nor progress and hints read saved): {display_path(STATE_DIR)}/ "
              f"cannot be written ({reason(error)}). Everything still runs, each exercise tested again every time.",
              file=sys.stderr)
        return False


def reason(error: OSError) -> str:
    """An OSError in a learner's words: what went wrong, and where."""
    where = f": {display_path(error.filename)}" if error.filename else ""
    return f"{error.strerror or error}{where}"


def now() -> str:
    return datetime.now().isoformat(timespec="seconds")


def backup_names(stem: str):
    """Names under .kata/backups/ to try in turn: `03_merge_partials.2026-11-29T10-40-00.py`, `...-2.py`, ..."""
    stamp = now().replace(":", "-")  # ':' is not allowed in Windows file names
    yield BACKUP_DIR / f"{stem}.{stamp}.py"
    n = 2
    while True:
        yield BACKUP_DIR / f"{stem}.{stamp}-{n}.py"
        n += 1
