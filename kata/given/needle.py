"""The data of exercise 15, made by code (nothing to download): documents that hide a needle.

A document of n tokens is a walk of filler words with one needle somewhere in it, and at its end a
question and its answer, the needle again:

    12 13 2 11 8 10 4 19 6 15 12 13 ? 19     (19 = NEEDLES + 3, ? = QUESTION: document(default_rng(3), 14))

Filler follows a fixed rule with a coin flip (after w comes (5w + 1) mod 16 or (5w + 2) mod 16), so a
model can learn to predict it; the needle, one of 8 tokens, stands at a uniform place among the first
n − 2. Predicting the answer is the long-range task: a model that attends only the last w tokens
sees the needle with probability about w/n and is at chance (1/8) otherwise; one that attends the
whole context finds it (the paper's Path-X argument, section 4.2: chance until the context holds the
whole problem). Every document comes from a seed: the same seed, the same documents.

A language model's loss weighs the answer as one target of n − 1, and at long n the filler's
gradient drowns it. Measured on the CPU in float32 with torch's attention, 16 rows a step: the model `python
grader.py train` trains on a GPU (4 layers, width 128) stays at chance for 1,000 steps at n = 64 on
every target's loss, and finds the needle in 150 steps at n = 256 on the answer's loss alone.
answers_only keeps the answers' targets alone, as fine-tuning leaves the prompt out of its loss.
"""
from dataclasses import replace

import numpy as np
import torch

from kata.given.gpt import IGNORE, Batch

FILLER = 16  # tokens 0 .. 15
NEEDLES = FILLER  # tokens 16 .. 23: the needle's 8 values
VALUES = 8
QUESTION = NEEDLES + VALUES  # 24
VOCAB = QUESTION + 1
CHANCE = 1 / VALUES


def document(rng: np.random.Generator, n: int) -> torch.Tensor:
    """One document of n >= 4 tokens (int64): filler, a needle among the first n − 2, QUESTION, the needle."""
    if n < 4:
        raise ValueError(f"a document needs at least 4 tokens (filler, needle, question, answer), got {n}")
    start, flips = rng.integers(FILLER), rng.integers(1, 3, size=n - 4)
    # w_t = 5 w_(t-1) + f_t (mod 16) unrolled: w_t = 5^t (w_0 + Σ_(s<=t) 5^(-s) f_s), as 5^4 = 1 and 5^(-1) = 13 mod 16
    t = np.arange(n - 3)
    powers, inverses = np.array([1, 5, 9, 13])[t % 4], np.array([1, 13, 9, 5])[t[1:] % 4]
    walk = powers * (start + np.concatenate([[0], np.cumsum(inverses * flips)])) % FILLER
    needle = NEEDLES + rng.integers(VALUES)
    tokens = np.insert(walk, rng.integers(n - 2), needle)
    return torch.from_numpy(np.concatenate([tokens, [QUESTION, needle]]))


def documents(rng: np.random.Generator, count: int, lo: int, hi: int) -> list[torch.Tensor]:
    """count documents of lengths drawn uniformly from [lo, hi]: a packed row's contents."""
    return [document(rng, int(n)) for n in rng.integers(lo, hi + 1, size=count)]


def rows(rng: np.random.Generator, batch: int, n: int) -> torch.Tensor:
    """batch documents of n tokens each, one a row: (batch, n) int64."""
    return torch.stack([document(rng, n) for _ in range(batch)])


def as_batch(rows: torch.Tensor) -> Batch:
    """Rows of whole documents (B, n) as a training batch: each token's target is the next, the last none."""
    return Batch(rows, torch.cat([rows[:, 1:], torch.full_like(rows[:, :1], IGNORE)], dim=1))


def answers_only(batch: Batch) -> Batch:
    """The batch with every target but the answers' (the token after each QUESTION) IGNOREd: the
    long-range task's loss alone, for rows of whole documents and packed rows alike."""
    return replace(batch, targets=torch.where(batch.tokens == QUESTION, batch.targets, IGNORE))


def answers(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Per row of whole documents (B, n): 1.0 where the prediction at QUESTION (the row's
    second-to-last position) is the needle, else 0.0; its mean is the long-range task's accuracy."""
    return (logits[:, -2].argmax(-1) == tokens[:, -1]).float()


def accuracy(model, rows: torch.Tensor, chunk: int) -> float:
    """The long-range task's accuracy of model (tokens -> logits) over rows of whole documents, `chunk`
    rows a call (at long n, all of them at once would not fit)."""
    return torch.cat([answers(model(part), part) for part in rows.split(chunk)]).mean().item()
