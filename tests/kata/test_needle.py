"""Exercise 15's data (kata/given/needle.py): documents that follow their stated rule, from a seed."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from kata.given import needle  # noqa: E402 - only once torch is known to import

LENGTHS = [4, 5, 9, 64, 1000]


@pytest.mark.parametrize("n", LENGTHS)
def test_a_document_is_the_walk_a_needle_and_its_question(n):
    """A walk off its rule (the learnable filler), a needle missing, doubled or past n − 2, or the answer
    not the needle: the model would learn another task than the lesson says."""
    for seed in range(20):
        doc = needle.document(np.random.default_rng(seed), n).numpy()
        at = np.flatnonzero(doc[:-2] >= needle.NEEDLES)
        assert doc.shape == (n,) and len(at) == 1 and needle.NEEDLES <= doc[at[0]] < needle.QUESTION
        assert doc[-2] == needle.QUESTION and doc[-1] == doc[at[0]]
        walk = np.delete(doc[:-2], at)
        assert set((walk[1:] - 5 * walk[:-1]) % needle.FILLER) <= {1, 2}, f"seed {seed}: after w comes 5w + 1 or 5w + 2"


def test_the_same_seed_gives_the_same_rows_and_another_seed_others():
    """Rows drawn afresh each call (the held-out set would change between evaluations), or not from the seed."""
    a, b = (needle.rows(np.random.default_rng(7), 4, 300) for _ in range(2))
    assert torch.equal(a, b) and not torch.equal(a, needle.rows(np.random.default_rng(8), 4, 300))


def test_a_document_too_short_for_its_parts_is_refused():
    with pytest.raises(ValueError, match="at least 4 tokens"):
        needle.document(np.random.default_rng(0), 3)


@pytest.mark.parametrize("n", LENGTHS)
def test_the_walk_is_the_recurrence_from_the_same_draws(n):
    """A closed form of w_t = 5 w_(t-1) + f_t (mod 16) off by a power, or drawing in another order: the
    documents of a seed would change, and with them every figure measured on them."""
    for seed in range(5):
        rng = np.random.default_rng(seed)
        walk = [int(rng.integers(needle.FILLER))]
        for flip in rng.integers(1, 3, size=n - 4):
            walk.append((5 * walk[-1] + int(flip)) % needle.FILLER)
        doc = needle.document(np.random.default_rng(seed), n).numpy()
        assert np.delete(doc[:-2], np.flatnonzero(doc[:-2] >= needle.NEEDLES)).tolist() == walk


def test_answers_only_keeps_each_documents_answer_and_nothing_else():
    """The needle's position kept instead of the answer's, the filler's targets kept, or only the
    row's last answer in a packed row: the long-range task's loss would not be the task's alone."""
    rows = needle.rows(np.random.default_rng(3), 4, 50)
    got = needle.answers_only(needle.as_batch(rows))
    kept = got.targets != needle.IGNORE
    assert kept[:, -2].all() and kept.sum() == 4 and torch.equal(got.targets[:, -2], rows[:, -1])
    assert torch.equal(got.tokens, rows)
    documents = needle.documents(np.random.default_rng(4), 3, 8, 20)
    packed = needle.answers_only(needle.as_batch(torch.cat(documents)[None]))
    ends = torch.tensor([len(d) for d in documents]).cumsum(0)
    assert (packed.targets != needle.IGNORE).nonzero()[:, 1].tolist() == (ends - 2).tolist()
    assert packed.targets[0, ends - 2].tolist() == [int(d[-1]) for d in documents]
