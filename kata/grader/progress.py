"""The learner's state under .kata/: exercises passed, hints read, backups of reset files."""
from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from pathlib import Path

from kata.exercises import ROOT
from kata.grader.results import display_path

STATE_DIR = ROOT / ".kata"
BACKUP_DIR = STATE_DIR / "backups"


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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.path)  # never a half-written progress file

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
