"""Exercise 11 where processes cannot start: its tests skip at collection, and the report says why."""
from pathlib import Path

import pytest

from kata.exercises import find
from kata.grader.report import summary
from kata.grader.results import classify

dist = pytest.importorskip("torch.distributed", reason="needs PyTorch")
ring = pytest.importorskip("kata.tools.ring", reason="needs PyTorch")


def test_no_gloo_is_a_reason_to_skip(monkeypatch):
    monkeypatch.setattr(dist, "is_gloo_available", lambda: False)
    assert ring.unavailable() == "this PyTorch build has no torch.distributed with the gloo backend"


def test_ranks_that_cannot_start_are_a_reason_to_skip(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("fork refused")

    monkeypatch.setattr(ring, "launch", refuse)
    assert ring.unavailable() == "two local gloo processes could not start (fork refused)"


def test_the_report_lists_11_as_skipped_with_the_reason():
    reason = "needs torch.distributed and local processes: this PyTorch build has no torch.distributed with gloo"
    events = [{"event": "collect_skip", "nodeid": "tests/test_11_ring_attention.py", "reason": reason},
              {"event": "finish", "exitstatus": 5}]
    result = classify(find("11"), Path("exercises/11_ring_attention.py"), events, returncode=5,
                      killed_after=None, seconds=1.0, output="")
    assert result.status == "skipped" and result.note == reason
    text = summary([result], "exercises/")
    assert "11   ring_attention  skipped" in text and f"11 skipped: {reason}" in " ".join(text.split())
    assert max(map(len, text.splitlines())) <= 80
