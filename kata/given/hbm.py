"""A simulated GPU memory for exercises 05 and 08: named arrays in HBM, every element moved counted.

Beside the simulator, the two pieces its algorithms walk with: blocks(n, size), the row blocks
of an array (the last one cut at n), and causal_mask(rows, keys), which pairs of a tile may attend.
"""
from __future__ import annotations

import operator
from contextlib import contextmanager
from typing import Iterator, NamedTuple

import numpy as np

ON_CHIP_HELP = "data read inside `with hbm.on_chip():` stays on chip until that block ends"


def blocks(n: int, size: int) -> list[slice]:
    """Consecutive blocks of `size` rows covering 0..n; the last one is cut at n."""
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def causal_mask(rows: slice, keys: slice) -> np.ndarray:
    """(len(rows), len(keys)) booleans, True where query i may attend key j, i.e. j <= i."""
    return np.arange(keys.start, keys.stop)[None, :] <= np.arange(rows.start, rows.stop)[:, None]


class CapacityError(RuntimeError):
    """The data live on chip would not fit in the SRAM's capacity."""


class Transfer(NamedTuple):
    """One move between HBM and SRAM, as kept in `HBM.log`."""
    op: str                      # "read" or "write"
    name: str                    # the array, e.g. "K"
    rows: tuple[int, int]        # (start, stop)
    cols: tuple[int, int] | None  # (start, stop); None for a 1-D array
    elements: int


class HBM:
    """Slow memory holding named 1-D and 2-D arrays; counts, in elements, every read and write.

    Set up, not counted:   hbm.put("Q", q)  (stores a copy), hbm.zeros("O", (n, d))
    Moves, counted:        hbm.read("K", rows, cols) -> a copy
                           hbm.write("O", rows, cols, value)  (value's shape must be the region's)
    Looks, not counted:    hbm.array("O"), hbm.shape("Q"), hbm.reads, hbm.writes,
                           hbm.reads_of("Q"), hbm.writes_of("O"), hbm.log, hbm.peak_on_chip

    `rows` and `cols` are slices or ranges of step 1 inside the array: slice(8, 16), range(8, 16),
    slice(None) for all; `cols=None` means every column. A 1-D array takes rows only:
    hbm.read("L", rows), hbm.write("L", rows, value=lse).

    On chip: every read happens inside `with hbm.on_chip():`, and what it returns stays live on
    chip until that block ends. Blocks nest, so an outer block can hold a query block for a whole
    loop while an inner one holds one key tile at a time. A value being written is live for the
    write. Live elements beyond `capacity` (None: unlimited) raise CapacityError.
    """

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity
        self.log: list[Transfer] = []
        self.peak_on_chip = 0  # the most elements ever live on chip at once
        self._arrays: dict[str, np.ndarray] = {}
        self._scopes: list[int] = []  # elements read in each open on-chip block, outermost first

    def __repr__(self) -> str:
        arrays = ", ".join(f"{name} {a.shape}" for name, a in self._arrays.items())
        return f"HBM({arrays}; reads {self.reads}, writes {self.writes}, peak on chip {self.peak_on_chip})"

    def put(self, name: str, array) -> None:
        """Store a copy of a 1-D or 2-D `array` under `name` (not counted)."""
        array = np.array(array, copy=True)
        if array.ndim not in (1, 2):
            raise ValueError(f"HBM holds 1-D and 2-D arrays; {name} has shape {array.shape}")
        self._arrays[name] = array

    def zeros(self, name: str, shape, dtype=np.float64) -> None:
        """Store an array of zeros under `name` (not counted)."""
        self.put(name, np.zeros(shape, dtype))

    def array(self, name: str) -> np.ndarray:
        """A copy of the whole array, for checking results (not counted)."""
        return self._get(name).copy()

    def shape(self, name: str) -> tuple[int, ...]:
        return self._get(name).shape

    @property
    def reads(self) -> int:
        return sum(t.elements for t in self.log if t.op == "read")

    @property
    def writes(self) -> int:
        return sum(t.elements for t in self.log if t.op == "write")

    def reads_of(self, name: str) -> int:
        self._get(name)
        return sum(t.elements for t in self.log if t.op == "read" and t.name == name)

    def writes_of(self, name: str) -> int:
        self._get(name)
        return sum(t.elements for t in self.log if t.op == "write" and t.name == name)

    @property
    def on_chip_now(self) -> int:
        """Elements read inside the on-chip blocks open now."""
        return sum(self._scopes)

    @contextmanager
    def on_chip(self) -> Iterator[None]:
        """A block whose reads stay live on chip until it ends."""
        self._scopes.append(0)
        try:
            yield
        finally:
            self._scopes.pop()

    def read(self, name: str, rows, cols=None) -> np.ndarray:
        """Load the region rows x cols of `name` into SRAM: a copy, counted as reads."""
        array = self._get(name)
        region, label = self._region(name, array, rows, cols)
        if not self._scopes:
            raise RuntimeError(f"hbm.read of {label} outside an on-chip block: read inside "
                               f"`with hbm.on_chip():` ({ON_CHIP_HELP})")
        value = array[region].copy()
        self._load(label, value.size)
        self._scopes[-1] += value.size
        self._record("read", name, region, value.size)
        return value

    def write(self, name: str, rows, cols=None, value=None) -> None:
        """Store `value` into the region rows x cols of `name`, counted as writes."""
        array = self._get(name)
        region, label = self._region(name, array, rows, cols)
        if value is None:
            raise TypeError(f"hbm.write to {label} needs a value: hbm.write(name, rows, cols, value)")
        value = np.asarray(value)
        expected = array[region].shape
        if value.shape != expected:
            raise ValueError(f"hbm.write to {label}: the region has shape {expected}, "
                             f"the value has shape {value.shape}")
        self._load(label, value.size)
        array[region] = value
        self._record("write", name, region, value.size)

    def _get(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            known = ", ".join(self._arrays) or "none yet (put them first)"
            raise KeyError(f"no array {name!r} in HBM; its arrays are: {known}")
        return self._arrays[name]

    def _region(self, name: str, array: np.ndarray, rows, cols) -> tuple[tuple[slice, ...], str]:
        """The region as slices, and how a message names it, e.g. K[0:4, 0:8]."""
        if array.ndim == 1 and cols is not None:
            raise IndexError(f"{name} is 1-D {array.shape}: give rows only")
        spans = [_span(name, "rows", rows, array.shape[0])]
        if array.ndim == 2:
            spans.append(_span(name, "cols", slice(None) if cols is None else cols, array.shape[1]))
        label = f"{name}[{', '.join(f'{a}:{b}' for a, b in spans)}]"
        return tuple(slice(a, b) for a, b in spans), label

    def _load(self, label: str, elements: int) -> None:
        """Check that `elements` more fit on chip beside what is live, and track the peak."""
        live = self.on_chip_now
        if self.capacity is not None and live + elements > self.capacity:
            raise CapacityError(
                f"SRAM full: moving {label} ({elements} elements) with {live} elements already live "
                f"on chip needs {live + elements}, but the capacity is {self.capacity} elements. "
                f"Move smaller blocks or release data sooner ({ON_CHIP_HELP}).")
        self.peak_on_chip = max(self.peak_on_chip, live + elements)

    def _record(self, op: str, name: str, region: tuple[slice, ...], elements: int) -> None:
        rows, *cols = [(s.start, s.stop) for s in region]
        self.log.append(Transfer(op, name, rows, cols[0] if cols else None, elements))


def _span(name: str, axis: str, index, size: int) -> tuple[int, int]:
    """(start, stop) of a slice or range of step 1 that lies within 0..size."""
    if not isinstance(index, (slice, range)):
        raise TypeError(f"{axis} of {name} must be a slice or a range, e.g. slice(i, i + 1) for one; "
                        f"got {index!r}")
    if index.step not in (None, 1):
        raise ValueError(f"{axis} of {name} must be contiguous (step 1); got step {index.step}")
    start = 0 if index.start is None else operator.index(index.start)
    stop = size if index.stop is None else operator.index(index.stop)
    if not 0 <= start <= stop <= size:
        raise IndexError(f"{axis} {start}:{stop} of {name} lie outside 0:{size}: "
                         f"cut the last block at the array's end, min(start + block, {size})")
    return start, stop
