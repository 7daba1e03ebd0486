"""How exercise 15's GPT trains: AdamW, one batch a step, progress every few steps.

    train(model, batch, steps, lr, every, report, evaluate=None) -> the last Progress

batch(step) gives the step's Batch (kata/given/gpt.py); the model takes the step as its dropout
seed, so that every step, and every layer, draws a mask of its own. The optimiser is nanoGPT's
choice: AdamW with betas (0.9, 0.95), weight decay 0.1 on the matrices only, gradients clipped to
norm 1, the learning rate warmed up linearly over the first tenth of the steps. Ctrl-C stops the
loop at the end of the step it falls in (a second press at once): train returns the Progress it had
reached, marked stopped.
"""
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class Progress:
    step: int
    loss: float  # the step's training loss
    # Tokens trained on per second over the steps since the last report, evaluation not counted. The
    # first step, which compiles and tunes the kernels (a minute and more on a GPU), counts only where
    # it is reported alone: averaged into later steps, it hid their speed for hundreds of steps.
    tokens_per_s: float
    accuracy: float | None = None  # the long-range task's, when an evaluation ran at this step
    stopped: bool = False  # Ctrl-C ended the run here


def optimizer(model: torch.nn.Module, lr: float) -> torch.optim.AdamW:
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([dict(params=matrices, weight_decay=0.1), dict(params=rest, weight_decay=0.0)],
                             lr=lr, betas=(0.9, 0.95))


def train(model, batch, steps: int, lr: float, every: int, report, evaluate=None) -> Progress:
    """Train for `steps` steps; every `every` steps (and at the last) call report(Progress), with the
    accuracy of evaluate(model) (run in evaluation mode, without gradients) when given."""
    opt = optimizer(model, lr)
    warmup = max(1, steps // 10)
    last, tokens, busy = Progress(0, float("nan"), 0.0), 0, 0.0
    with _ctrl_c_kept() as pressed:
        try:
            for step in range(1, steps + 1):
                start = time.perf_counter()
                for group in opt.param_groups:
                    group["lr"] = lr * min(1.0, step / warmup)
                b = batch(step)
                model.train()
                _, loss = model(b.tokens, b.targets, b.positions, b.doc_ids, seed=step)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                loss_value = loss.item()  # on a GPU, waits for the step's work: the time must hold it
                busy += time.perf_counter() - start
                tokens += b.tokens.numel()
                last = Progress(step, loss_value, tokens / busy)
                reported = step % every == 0 or step == steps
                if reported:
                    last = replace(last, accuracy=_evaluate(model, evaluate))
                    report(last)
                if reported or step == 1:
                    tokens, busy = 0, 0.0
                if pressed():
                    return replace(last, stopped=True)
        except KeyboardInterrupt:
            return replace(last, stopped=True)
    return last


@contextmanager
def _ctrl_c_kept():
    """Yields pressed() -> whether Ctrl-C came, the loop to stop at the end of its step. Left to raise
    KeyboardInterrupt wherever Python is, the first press can be lost (raised in a finaliser, it is
    printed and dropped) and training runs on; a second press raises it. Only the main thread can
    take the signal: elsewhere Ctrl-C keeps Python's own handling."""
    presses = []

    def handler(signum, frame):
        presses.append(signum)
        if len(presses) > 1:
            raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread
        yield lambda: False
        return
    try:
        yield lambda: bool(presses)
    finally:
        signal.signal(signal.SIGINT, previous)


def _evaluate(model, evaluate) -> float | None:
    if evaluate is None:
        return None
    model.eval()
    with torch.no_grad():
        return evaluate(model)
