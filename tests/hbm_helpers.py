"""Running the learner's code on the HBM simulator, and checking what it moved: shared by the IO tests.

`call_counted` runs an algorithm with hbm.array blocked (it reads back without counting) and turns
a full SRAM into a failure that names the call. The checks compare each array's reads and writes
with a hand count, find the rows moved the wrong number of times from the log, and read the
outputs back, naming the rows still holding the NaN they started with.
"""
from __future__ import annotations

import numpy as np

from checks import assert_close
from kata.given.hbm import HBM, CapacityError
from oracles import TOL


def call_counted(function, hbm: HBM, what: str, *args, fits: str = "", **kwargs) -> None:
    """function(hbm, *args, **kwargs) with hbm.array raising: every value must come from hbm.read.

    `fits` says what the SRAM's capacity was chosen to hold, for the message when it overflows.
    """
    __tracebackhide__ = True

    def uncounted(name):
        raise AssertionError(f"{what} called hbm.array({name!r}), which reads back without counting: inside "
                             f"the algorithm every value comes from hbm.read (counted)")

    hbm.array = uncounted  # shadows the method for the call only
    try:
        function(hbm, *args, **kwargs)
    except CapacityError as error:
        holds = f", enough for {fits}" if fits else ""
        raise AssertionError(f"{what} overflowed the SRAM: {error}\n  convention: the SRAM holds {hbm.capacity} "
                             f"elements here{holds}; release each tile (end its on_chip block) before reading "
                             f"the next") from None
    finally:
        del hbm.array


def check_moves(hbm: HBM, expected: dict, what: str, convention: str) -> None:
    """{array: (reads, writes)} against what hbm moved; names each array that is off."""
    __tracebackhide__ = True
    got = {name: (hbm.reads_of(name), hbm.writes_of(name)) for name in expected}
    wrong = [f"  {name}: expected {expected[name][0]} reads, {expected[name][1]} writes; "
             f"got {got[name][0]} reads, {got[name][1]} writes" for name in expected if got[name] != expected[name]]
    if wrong:
        raise AssertionError("\n".join([f"{what} moved the wrong number of elements:", *wrong,
                                        f"  convention: {convention}"]))


def check_counts(hbm: HBM, closed_form, expected: dict, what: str, convention: str, shape: tuple,
                 causal: bool) -> None:
    """Each array's moves against the hand count, then the closed form against the same totals."""
    __tracebackhide__ = True
    check_moves(hbm, expected, what, convention)
    closed = tuple(closed_form(*shape, causal=causal))
    assert closed == (hbm.reads, hbm.writes) == totals(expected), (
        f"{closed_form.__name__}{(*shape, causal)} = {closed}, the simulation moved "
        f"{(hbm.reads, hbm.writes)}, the hand count is {totals(expected)} (reads, writes)")


def check_closed_forms(ex, expected: dict, n: int, d: int, block_q: int, block_k: int, causal: bool) -> None:
    """{closed form's name in ex: (reads, writes)}: each closed form at these sizes against its count."""
    __tracebackhide__ = True
    for name, want in expected.items():
        got = getattr(ex, name)(n, d, block_q, block_k, causal=causal)
        assert tuple(got) == want, (f"{name}({n}, {d}, {block_q}, {block_k}, causal={causal}): "
                                    f"expected (reads, writes) = {want}, got {tuple(got)}")


def totals(moves: dict) -> tuple[int, int]:
    """(reads, writes) summed over the arrays of a hand count."""
    return sum(r for r, _ in moves.values()), sum(w for _, w in moves.values())


def times_moved(hbm: HBM, op: str, name: str) -> np.ndarray:
    """How many times each element of `name` was read (op="read") or written, from the log."""
    count = np.zeros(hbm.shape(name), int)
    for t in hbm.log:
        if t.op == op and t.name == name:
            count[slice(*t.rows), slice(*t.cols) if t.cols else ...] += 1
    return count


def check_times(hbm: HBM, op: str, name: str, expected, what: str, convention: str) -> None:
    """Each element of `name` moved by `op` `expected` times (a number, or one per row); names the
    first row that was not."""
    __tracebackhide__ = True
    count = times_moved(hbm, op, name)
    per_row = np.broadcast_to(np.asarray(expected), count.shape[:1])
    wrong = np.argwhere(count != (per_row if count.ndim == 1 else per_row[:, None]))
    if wrong.size:
        row = int(wrong[0][0])
        done = "read" if op == "read" else "written"
        raise AssertionError(f"{what}: row {row} of {name} was {done} {count[row].tolist()} times per element, "
                             f"expected {int(per_row[row])} each\n  convention: {convention}")


def check_outputs(hbm: HBM, expected: dict, what: str) -> None:
    """{name: (oracle, convention)}: each output array, read back from HBM, against its oracle."""
    __tracebackhide__ = True
    for name, (value, convention) in expected.items():
        rows = np.unique(np.argwhere(np.isnan(hbm.array(name)))[:, 0])
        if rows.size:
            raise AssertionError(f"{name} after {what}: rows {rows.tolist()} still hold NaN, the poison "
                                 f"{name} started with: never written with hbm.write, or computed as NaN")
        assert_close(hbm.array(name), value, what=f"{name} after {what}", convention=convention, **TOL[np.float64])
