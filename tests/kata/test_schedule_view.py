"""The schedule picture: it draws exactly what tile_schedule returned, and turns a wrong return
value or an unfinished stub into one line instead of a traceback."""
from types import SimpleNamespace

import pytest

from kata.tools.schedule_view import draw, show

CAUSAL_3x3 = [(0, 0, True), (1, 0, False), (1, 1, True), (2, 0, False), (2, 1, False), (2, 2, True)]


def module_returning(result):
    """A stand-in for exercise 04 whose tile_schedule records its call and returns `result`."""
    calls = []

    def tile_schedule(n_q, n_k, block_q, block_k, causal=False, mask=None):
        calls.append((n_q, n_k, block_q, block_k, causal))
        if isinstance(result, Exception):
            raise result
        return result
    return SimpleNamespace(tile_schedule=tile_schedule, calls=calls)


def test_draw_pins_the_picture():
    """Rows are query blocks, columns key blocks; computed, masked and skipped tiles differ."""
    assert draw(CAUSAL_3x3, 6, 6, 2, 2, True) == "\n".join([
        "tile_schedule(n_q=6, n_k=6, block_q=2, block_k=2, causal=True): 3 x 3 tiles",
        "    key block j ->",
        "    0 1 2",
        "i 0 ▚▚····",
        "i 1 ██▚▚··",
        "i 2 ████▚▚",
        "██ computed, no mask   ▚▚ computed with the mask   ·· skipped",
        "6 of 9 tiles computed, 3 of them with the mask",
    ])


def test_draw_counts_ragged_blocks_and_labels_past_ten():
    """Blocks are counted with a ceiling (ragged edges); key blocks from 10 on get a tens line."""
    picture = draw([(0, 11, False)], 3, 23, 2, 2, False).splitlines()
    assert picture[0].endswith("causal=False): 2 x 12 tiles")
    assert picture[2].endswith("1 1") and picture[3].endswith("8 9 0 1")
    assert picture[4] == "i 0 " + "··" * 11 + "██"


def test_draw_notes_tiles_out_of_order():
    """The picture cannot show order, so a note says when the list is out of it."""
    picture = draw(list(reversed(CAUSAL_3x3)), 6, 6, 2, 2, True)
    assert "out of order" in picture


def test_show_calls_tile_schedule_with_the_defaults():
    """The default is the causal example of 6 x 6 tiles, 2 x 2 each: the diagonal needs the mask."""
    module = module_returning([(i, j, i == j) for i in range(6) for j in range(i + 1)])
    picture, ok = show(module)
    assert ok
    assert module.calls == [(12, 12, 2, 2, True)]
    assert "21 of 36 tiles computed, 6 of them with the mask" in picture


def test_show_passes_sizes_and_no_causal():
    module = module_returning(CAUSAL_3x3)
    show(module, 6, 5, 2, 3, causal=False)
    assert module.calls == [(6, 5, 2, 3, False)]


@pytest.mark.parametrize("result, words", [
    (NotImplementedError("tile_schedule: replace this line with your code"), "not started"),
    (IndexError("index 7 is out of bounds"), "raised IndexError: index 7"),
    ({(0, 0): True}, "expected a list"),
    ([(0, 0)], "must be a tuple (i, j, needs_mask)"),
    ([(0, 0, 1)], "expected Python int, int, bool"),
    ([(0, 3, False)], "out of range: query blocks are 0-2, key blocks 0-2"),
    ([(-1, 0, False)], "out of range"),
    ([(0, 0, True), (0, 0, True)], "listed twice"),
], ids=["stub", "exception", "dict", "pair", "int-flag", "key-block-too-far", "negative", "twice"])
def test_show_explains_a_wrong_schedule_in_one_line(result, words):
    """A learner's bug is named in one line, never shown as the viewer's own traceback."""
    message, ok = show(module_returning(result), 6, 6, 2, 2)
    assert words in message and "\n" not in message and not ok


def test_show_refuses_empty_sizes():
    module = module_returning([])
    message, ok = show(module, 0, 6, 1, 1)
    assert "at least 1" in message and not ok and module.calls == []
