"""Every address a kernel loads or stores in Triton's interpreter, checked before it is touched.

In the interpreter a kernel's pointers are the process's own addresses: a load past a tensor's end
reads whatever lies there (a garbage loop count, then a test that never ends) or ends the process
with a segfault; on a GPU it mostly reads garbage without a word. While `watch` is on, each load
and store of an interpreted launch is checked against the elements of the tensors the launch was
given (each tensor's own, not the rest of its storage), and against ranges a test forbids
(block-list entries past their count: readable memory, but a consumer must never read them); the
first address outside them stops the launch, and the test fails with the kernel, its program, the
line of the kernel that made the access, the tensor and how far past its end. tests/triton_helpers.py
runs every call of the Triton exercises under it (`call`). Interpreter internals: on a Triton
without them, `available()` is False and nothing is checked.
"""
from __future__ import annotations

import contextlib
import inspect
import linecache
import os
import sys

import numpy as np
import torch

OUTSIDE = ("a kernel reads and writes only the elements of the tensors it is given: a tile that can reach past "
           "an end (query rows past n_q, keys past n_k or kv_lens[b], a loop's last tile) is loaded and stored "
           "with a mask, and every pointer steps by its own tensor's strides; on a GPU such an access reads "
           "garbage or faults, in the interpreter it reads this process's memory (a crash, or a garbage loop "
           "count that never ends)")


class OutOfBounds(Exception):
    """Raised inside the interpreter at the first address outside the allowed ranges."""


def available() -> bool:
    """Whether this Triton's interpreter has the load, store and launch functions `watch` wraps."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    return all(hasattr(cls, name) for cls, name in ((interpreter.InterpreterBuilder, "create_masked_load"),
                                                     (interpreter.InterpreterBuilder, "create_masked_store"),
                                                     (interpreter.GridExecutor, "__call__")))


def _tensors(name, value):
    """(argument name, tensor) of every tensor in a launch argument: tuples and descriptors opened."""
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from _tensors(f"{name}[{i}]", item)
    elif isinstance(getattr(value, "base", None), torch.Tensor):  # a TensorDescriptor
        yield name, value.base


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """Byte range [start, stop) from t's first element to the end of its last."""
    start = t.data_ptr()
    if t.numel() == 0:
        return start, start
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return start, start + (last + 1) * t.element_size()


class _Ranges:
    """Byte ranges [start, stop) and what each is, found by address."""

    def __init__(self, ranges):
        ranges = sorted(ranges, key=lambda r: r[0])
        self.starts = np.array([r[0] for r in ranges], dtype=np.uint64)
        self.stops = np.array([r[1] for r in ranges], dtype=np.uint64)
        self.labels = [r[2] for r in ranges]
        self.ranges = ranges

    def find(self, addresses):
        """Per address, the index of the range holding it, or -1."""
        i = np.searchsorted(self.starts, addresses, side="right").astype(np.int64) - 1
        inside = (i >= 0) & (addresses < self.stops[np.maximum(i, 0)])
        return np.where(inside, i, -1)


class _Launch:
    """The interpreted launch running now: its kernel and the tensors it was given."""

    def __init__(self, fn, bound: dict):
        self.fn = fn
        self.tensors = [(name, t) for key, value in bound.items() for name, t in _tensors(key, value)]
        merged = []  # the tensors' extents, overlaps joined (q, k and v may be views of one buffer)
        for start, stop in sorted(_extent(t) for _, t in self.tensors):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], stop)
            else:
                merged.append([start, stop])
        self.starts = np.array([r[0] for r in merged], dtype=np.uint64)
        self.stops = np.array([r[1] for r in merged], dtype=np.uint64)

    def outside(self, addresses, size: int):
        """Per address, whether the access of `size` bytes there leaves every tensor's elements."""
        if not self.starts.size:
            return np.ones(addresses.shape, dtype=bool)
        i = np.searchsorted(self.starts, addresses, side="right").astype(np.int64) - 1
        return (i < 0) | (addresses + np.uint64(size) > self.stops[np.maximum(i, 0)])

    def nearest(self, address: int, size: int) -> str:
        """The tensor nearest an address outside them all, and how many of its elements the access
        lies past its end or before its start."""
        gaps = []
        for name, t in self.tensors:
            start, stop = _extent(t)
            gap, side = (address + size - stop, "past its end") if address >= start else (start - address, "before its start")
            gaps.append((-(-gap // t.element_size()), side, name, t))
        if not gaps:
            return "memory: the launch was given no tensor"
        n, side, name, t = min(gaps, key=lambda g: g[0] * g[3].element_size())
        return f"{name} {tuple(t.shape)} {str(t.dtype)[6:]} {n} element{'s' * (n != 1)} {side}"


def _block(bad: np.ndarray) -> str:
    """` (at [7:16, 0:16] of its 16 x 16 addresses)`: where in the access's tile the bad addresses lie."""
    if bad.size == 1:
        return ""
    spans = ", ".join(f"{i.min()}:{i.max() + 1}" for i in np.nonzero(bad))
    return f" (at [{spans}] of its {' x '.join(map(str, bad.shape))} addresses)"


def _kernel_lines(launch_code) -> str:
    """`file:line in function: source` for each frame of the kernel's code and its helpers', from
    the launch down to the access: Triton's own frames and this module's left out."""
    triton_dir = os.path.dirname(sys.modules["triton"].__file__)
    lines, frame = [], sys._getframe(1)
    while frame is not None and frame.f_code is not launch_code:
        path = frame.f_code.co_filename
        if not path.startswith(triton_dir) and path != __file__ and not path.endswith("fast_interpreter.py"):
            source = linecache.getline(path, frame.f_lineno).strip()
            lines.append(f"\n    {os.path.basename(path)}:{frame.f_lineno} in {frame.f_code.co_name}: {source}")
        frame = frame.f_back
    return "".join(reversed(lines))


def _program(builder) -> str:
    """`program 3 of 4`, or `program (1, 0) of (2, 3)`: the grid's trailing axes of 1 left out."""
    axes = max([1] + [i + 1 for i, n in enumerate(builder.grid_dim) if n > 1])
    if axes == 1:
        return f"program {builder.grid_idx[0]} of {builder.grid_dim[0]}"
    return f"program {tuple(builder.grid_idx[:axes])} of {tuple(builder.grid_dim[:axes])}"


_active: list[dict] = []  # the state of the watch that patched the interpreter, while one is on


@contextlib.contextmanager
def watch(forbidden=(), what: str = "", convention: str = "", names: dict | None = None):
    """Check every load and store of the interpreted launches made inside the block. forbidden:
    (start, stop, describe) byte ranges no load or store may touch, describe(address) -> str naming
    the entry; names: a kernel's name as the message says it. At the first address outside the
    launch's tensors or inside a forbidden range the launch stops, and an AssertionError says `what`
    was run, which kernel's program touched what, from which lines, and the convention broken:
    `convention` for a forbidden range, OUTSIDE for the rest. A watch inside another adds its
    forbidden ranges and names to the outer one, which reports. Without the interpreter's internals
    (`available()`) nothing is checked."""
    __tracebackhide__ = True
    if _active:
        state = _active[0]
        kept = state["forbidden"], state["names"]
        state["forbidden"] = _Ranges([*kept[0].ranges, *forbidden])
        state["names"] = {**kept[1], **(names or {})}
        try:
            yield
        finally:
            state["forbidden"], state["names"] = kept
        return
    if not available():
        yield
        return
    from triton.runtime import interpreter
    builder, executor = interpreter.InterpreterBuilder, interpreter.GridExecutor
    load, store, launch = builder.create_masked_load, builder.create_masked_store, executor.__call__
    state = {"forbidden": _Ranges(forbidden), "names": dict(names or {}), "launch": None, "problem": None}

    def check(interpreting, ptrs, mask, verb):
        running = state["launch"]
        if running is None:
            return
        mask = np.broadcast_to(mask.data, np.shape(ptrs.data))
        addresses = ptrs.data[mask].astype(np.uint64)
        if not addresses.size:
            return
        size = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        banned = state["forbidden"]
        hit = banned.find(addresses) if banned.labels else None
        if hit is not None and (hit >= 0).any():
            bad = hit >= 0
            first = int(np.argmax(bad))
            problem = f"{verb} {banned.labels[int(hit[first])](int(addresses[first]))}"
            broken = convention or OUTSIDE
        else:
            bad = running.outside(addresses, size)
            if not bad.any():
                return
            first = int(np.argmax(bad))
            problem = f"{verb} {running.nearest(int(addresses[first]), size)}"
            broken = OUTSIDE
        out = np.zeros(mask.shape, dtype=bool)
        out[mask] = bad
        name = running.fn.__name__
        state["problem"] = (f"{state['names'].get(name, name)}, {_program(interpreting)}, {problem}"
                            f"{_block(out)}{_kernel_lines(launch.__code__)}\n  convention: {broken}")
        raise OutOfBounds(state["problem"])  # before the access: it could end the process

    def checked_load(self, ptrs, mask, other, *args, **kwargs):
        check(self, ptrs, mask, "read")
        return load(self, ptrs, mask, other, *args, **kwargs)

    def checked_store(self, ptrs, value, mask, *args, **kwargs):
        check(self, ptrs, mask, "wrote")
        return store(self, ptrs, value, mask, *args, **kwargs)

    def checked_launch(self, *args, **kwargs):
        signature = inspect.signature(self.fn)  # the launch's options (num_warps, ...) are not the kernel's
        bound = signature.bind_partial(*args, **{k: v for k, v in kwargs.items() if k in signature.parameters})
        outer = state["launch"]
        state["launch"] = _Launch(self.fn, bound.arguments)
        try:
            return launch(self, *args, **kwargs)
        finally:
            state["launch"] = outer

    builder.create_masked_load, builder.create_masked_store, executor.__call__ = checked_load, checked_store, checked_launch
    _active.append(state)
    try:
        yield
    except Exception:
        if state["problem"] is None:
            raise
    finally:
        _active.pop()
        builder.create_masked_load, builder.create_masked_store, executor.__call__ = load, store, launch
    if state["problem"] is not None:  # raised, or caught on its way out: either way the access was wrong
        raise AssertionError((f"{what}: " if what else "") + state["problem"]) from None
