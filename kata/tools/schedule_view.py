"""Draw exercise 04's tile schedule in the terminal: which tiles are computed, masked or skipped.

    show(module, n_q=12, n_k=12, block_q=2, block_k=2, causal=True) -> (str, bool)
        Calls module.tile_schedule(n_q, n_k, block_q, block_k, causal=causal) and returns the
        drawing and True, or one line saying what to fix (a stub not started, a wrong return
        value, an exception) and False. `python grader.py --show 04 [n_q n_k block_q block_k] [--no-causal]` prints it.
    draw(schedule, n_q, n_k, block_q, block_k, causal) -> str
        The drawing of a schedule already in hand: query blocks down, key blocks across.
        Raises ValueError naming the first tile that is not (i, j, needs_mask) in range.
"""
from __future__ import annotations

import math
from types import ModuleType

COMPUTED, MASKED, SKIPPED = "██", "▚▚", "··"  # two columns a tile, so a square tile looks square
LEGEND = f"{COMPUTED} computed, no mask   {MASKED} computed with the mask   {SKIPPED} skipped"
MAX_BLOCKS = 64  # wider than most terminals at two columns a tile


def check(schedule, n_q: int, n_k: int, block_q: int, block_k: int) -> None:
    """Raise ValueError, naming the tile, unless `schedule` is a list of in-range (int, int, bool)."""
    t_r, t_c = math.ceil(n_q / block_q), math.ceil(n_k / block_k)
    if not isinstance(schedule, list):
        raise ValueError(f"tile_schedule returned {type(schedule).__name__}, expected a list of (i, j, needs_mask)")
    seen = set()
    for tile in schedule:
        if not (isinstance(tile, tuple) and len(tile) == 3):
            raise ValueError(f"tile_schedule returned {tile!r}: each tile must be a tuple (i, j, needs_mask)")
        i, j, needs_mask = tile
        if type(i) is not int or type(j) is not int or type(needs_mask) is not bool:
            raise ValueError(f"tile {tile!r}: expected Python int, int, bool, got "
                             f"{type(i).__name__}, {type(j).__name__}, {type(needs_mask).__name__} "
                             f"(use int(...) and bool(...) on NumPy values)")
        if not (0 <= i < t_r and 0 <= j < t_c):
            raise ValueError(f"tile {tile!r} is out of range: query blocks are 0-{t_r - 1}, key blocks 0-{t_c - 1} "
                             f"(n_q={n_q}, n_k={n_k}, block_q={block_q}, block_k={block_k})")
        if (i, j) in seen:
            raise ValueError(f"tile ({i}, {j}) is listed twice")
        seen.add((i, j))


def draw(schedule, n_q: int, n_k: int, block_q: int, block_k: int, causal: bool) -> str:
    """The grid of tiles with block labels, a legend and the counts."""
    check(schedule, n_q, n_k, block_q, block_k)
    t_r, t_c = math.ceil(n_q / block_q), math.ceil(n_k / block_k)
    if max(t_r, t_c) > MAX_BLOCKS:
        return (f"{t_r} x {t_c} tiles is too many to draw (at most {MAX_BLOCKS} a side): "
                f"use larger blocks or fewer tokens")
    cells = {(i, j): MASKED if needs_mask else COMPUTED for i, j, needs_mask in schedule}
    label = len(str(t_r - 1))
    indent = " " * (label + 3)
    lines = [f"tile_schedule(n_q={n_q}, n_k={n_k}, block_q={block_q}, block_k={block_k}, causal={causal}): "
             f"{t_r} x {t_c} tiles", indent + "key block j ->"]
    if t_c > 10:  # two columns a tile leave room for one digit: tens on a line of their own
        lines.append((indent + "".join(f"{j // 10 or ' '} " for j in range(t_c))).rstrip())
    lines.append((indent + "".join(f"{j % 10} " for j in range(t_c))).rstrip())
    for i in range(t_r):
        row = "".join(cells.get((i, j), SKIPPED) for j in range(t_c))
        lines.append(f"i {i:>{label}} {row}")
    masked = sum(needs_mask for _, _, needs_mask in schedule)
    lines += [LEGEND, f"{len(schedule)} of {t_r * t_c} tiles computed, {masked} of them with the mask"]
    if schedule != sorted(schedule):
        lines.append("note: the tiles are out of order; list query block i ascending, then key block j")
    return "\n".join(lines)


def show(module: ModuleType, n_q: int = 12, n_k: int = 12, block_q: int = 2, block_k: int = 2,
         causal: bool = True) -> tuple[str, bool]:
    """Draw what the learner's module.tile_schedule returns, or say in one line what to fix (and False).

    The default is causal with 6 x 6 tiles of 2 x 2: the diagonal tiles need the mask, the rest
    below it do not, and those above it are skipped (with 1 x 1 tiles no tile needs the mask).
    """
    if min(n_q, n_k, block_q, block_k) < 1:
        return f"n_q, n_k, block_q and block_k must be at least 1 (got {n_q}, {n_k}, {block_q}, {block_k})", False
    call = f"tile_schedule({n_q}, {n_k}, {block_q}, {block_k}, causal={causal})"
    try:
        schedule = module.tile_schedule(n_q, n_k, block_q, block_k, causal=causal)
    except NotImplementedError as exc:
        return f"not started: {exc}. Write tile_schedule in 04_tiled_attention.py first, then draw it again", False
    except Exception as exc:  # the learner's code: say what broke, the tests give the traceback
        return f"{call} raised {type(exc).__name__}: {exc} (run the tests of exercise 04 for the traceback)", False
    try:
        return draw(schedule, n_q, n_k, block_q, block_k, causal), True
    except ValueError as exc:
        return f"{call}: {exc}", False
