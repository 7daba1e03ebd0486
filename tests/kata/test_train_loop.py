"""The training loop every GPT of exercise 15 runs (kata/given/train.py): Ctrl-C, on a model too small
to need the kernels."""
import os
import signal
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
from kata.given.gpt import Batch  # noqa: E402 - gpt needs torch
from kata.given.train import train  # noqa: E402

STEPS = 5


class Tiny(torch.nn.Module):
    """A model of the loop's interface: model(tokens, targets, positions, doc_ids, seed) -> (logits, loss)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2, 2))

    def forward(self, tokens, targets, positions=None, doc_ids=None, seed=0):
        return None, (self.w ** 2).sum()


def ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)


class Finaliser:
    """Ctrl-C pressed while Python runs a finaliser: the KeyboardInterrupt raised there is printed and
    dropped, as it can be in any library's __del__ at the moment a learner presses it."""

    def __del__(self):
        ctrl_c()
        sum(range(1000))  # the handler runs at the interpreter's next check, still in here


def presses(at: int, count: int = 1, where=ctrl_c):
    """A batch function that presses Ctrl-C `count` times at step `at`."""
    def batch(step):
        if step == at:
            for _ in range(count):
                where()
        return Batch(torch.zeros(1, 1), torch.zeros(1, 1))
    return batch


def run(batch):
    seen = []
    last = train(Tiny(), batch, STEPS, 0.1, 1, seen.append)
    return last, [p.step for p in seen]


@pytest.mark.parametrize("where", ["plain", "in a finaliser"])
def test_ctrl_c_stops_at_the_end_of_its_step(where):
    """The step it falls in is finished and reported, then the loop stops, marked stopped: also when it
    falls in a finaliser, where a KeyboardInterrupt is lost and training went on to the end."""
    before = signal.getsignal(signal.SIGINT)
    last, reported = run(presses(2, where=Finaliser if where == "in a finaliser" else ctrl_c))
    assert (last.step, last.stopped, reported) == (2, True, [1, 2])
    assert signal.getsignal(signal.SIGINT) is before, "Ctrl-C's handler is not given back after training"


def test_a_second_ctrl_c_stops_at_once():
    """Pressed twice, the loop does not wait for the step's end: the last step finished is returned."""
    last, reported = run(presses(3, count=2))
    assert (last.step, last.stopped, reported) == (2, True, [1, 2])


def test_without_ctrl_c_every_step_runs():
    last, reported = run(presses(at=0))
    assert (last.step, last.stopped, reported) == (STEPS, False, list(range(1, STEPS + 1)))


@pytest.fixture
def clock(monkeypatch):
    """The training loop's clock, [seconds]: it moves only where a test moves it."""
    import kata.given.train as loop
    now = [0.0]
    monkeypatch.setattr(loop, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    return now


def test_tokens_per_second_since_the_last_report_without_the_first_step(clock):
    """A report's speed is its own steps' (the bug: every report averaged since step 1, whose compiling
    and tuning took a minute and more on a GPU and hid the speed for hundreds of steps); the first step
    counts only where it is reported alone."""

    def batch(step):
        clock[0] += 100.0 if step == 1 else 1.0 / step  # step 1 compiles; step s takes 1/s seconds
        return Batch(torch.zeros(1, 3), torch.zeros(1, 3))  # 3 tokens a step

    for every, expected in ((2, {2: 3 / (1 / 2), 4: 6 / (1 / 3 + 1 / 4), 5: 3 / (1 / 5)}),
                            (1, {1: 3 / 100, 2: 3 / (1 / 2)})):
        seen = []
        train(Tiny(), batch, STEPS, 0.1, every, seen.append)
        got = {p.step: p.tokens_per_s for p in seen if p.step in expected}
        assert got == pytest.approx(expected), f"every {every}: tokens/s by step {got}, expected {expected}"


def test_tokens_per_second_waits_for_the_steps_work(clock):
    """On a GPU a step's kernels run after the Python that launched them returns: the time of a step
    holds the wait for its loss (the bug: timed before it, an H100 showed twice the real speed)."""

    class Queued(torch.nn.Module):
        """Launching takes no time; reading the loss waits 2 s for the device."""

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, tokens, targets, positions=None, doc_ids=None, seed=0):
            model = self

            class Loss:
                def backward(self):
                    model.w.grad = torch.zeros(1)

                def item(self):
                    clock[0] += 2.0
                    return 1.0
            return None, Loss()

    seen = []
    train(Queued(), lambda step: Batch(torch.zeros(1, 3), torch.zeros(1, 3)), 3, 0.1, 1, seen.append)
    assert [p.tokens_per_s for p in seen] == [1.5, 1.5, 1.5]
