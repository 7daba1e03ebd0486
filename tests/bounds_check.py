"""Every address a kernel loads or stores in Triton's interpreter, checked before it is touched.

In the interpreter a kernel's pointers are the process's own addresses: a load past a tensor's end
reads whatever lies there (a garbage loop count, then a test that never ends) or ends the process
with a segfault; on a GPU it mostly reads garbage without a word. While `watch` is on, each load
and store of an interpreted launch is checked against the storage of the tensors the launch was
given, and against ranges a test forbids (block-list entries past their count: readable memory,
but a consumer must never read them); the first address outside them stops the launch, and the
test fails with the kernel, the argument and the entry named. Interpreter internals: on a Triton
without them, `available()` is False and nothing is checked.
"""
from __future__ import annotations

import contextlib
import inspect

import numpy as np
import torch


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


class _Ranges:
    """Byte ranges [start, stop) and what each is, found by address."""

    def __init__(self, ranges):
        ranges = sorted(ranges, key=lambda r: r[0])
        self.starts = np.array([r[0] for r in ranges], dtype=np.uint64)
        self.stops = np.array([r[1] for r in ranges], dtype=np.uint64)
        self.labels = [r[2] for r in ranges]

    def find(self, addresses):
        """Per address, the index of the range holding it, or -1."""
        i = np.searchsorted(self.starts, addresses, side="right").astype(np.int64) - 1
        inside = (i >= 0) & (addresses < self.stops[np.maximum(i, 0)])
        return np.where(inside, i, -1)


@contextlib.contextmanager
def watch(forbidden=(), what: str = "", convention: str = "", names: dict | None = None):
    """Check every load and store of the interpreted launches made inside the block. forbidden:
    (start, stop, describe) byte ranges no load or store may touch, describe(address) -> str naming
    the entry; names: a kernel's name as the message says it. On the first address outside the
    launch's tensors or inside a forbidden range the launch stops, and an AssertionError says `what`
    was run, which kernel touched what, and the convention."""
    __tracebackhide__ = True
    from triton.runtime import interpreter
    builder, executor = interpreter.InterpreterBuilder, interpreter.GridExecutor
    load, store, launch = builder.create_masked_load, builder.create_masked_store, executor.__call__
    banned = _Ranges(forbidden)
    state = {"kernel": None, "allowed": None, "problem": None}

    def check(ptrs, mask, verb):
        addresses = np.broadcast_to(ptrs.data, np.shape(mask.data))[mask.data].astype(np.uint64).ravel()
        if not addresses.size or state["allowed"] is None:
            return
        hit = banned.find(addresses)
        if (hit >= 0).any():
            address = int(addresses[hit >= 0][0])
            problem = f"{verb} {banned.labels[int(hit[hit >= 0][0])](address)}"
        elif (state["allowed"].find(addresses) < 0).any():
            address = int(addresses[state["allowed"].find(addresses) < 0][0])
            allowed = state["allowed"]
            below = int(np.searchsorted(allowed.starts, address, side="right")) - 1
            past = address - int(allowed.stops[below]) if below >= 0 else -1
            near = ("" if past < 0 else f", right after the end of {allowed.labels[below]}" if past == 0 else
                    f", {past} bytes past the end of {allowed.labels[below]}")
            problem = f"{verb} an address outside every tensor it was given{near}"
        else:
            return
        state["problem"] = f"{(names or {}).get(state['kernel'], state['kernel'])} {problem}"
        raise OutOfBounds(state["problem"])  # before the access: it could end the process

    def checked_load(self, ptrs, mask, other, *args, **kwargs):
        check(ptrs, mask, "read")
        return load(self, ptrs, mask, other, *args, **kwargs)

    def checked_store(self, ptrs, value, mask, *args, **kwargs):
        check(ptrs, mask, "wrote")
        return store(self, ptrs, value, mask, *args, **kwargs)

    def checked_launch(self, *args, **kwargs):
        signature = inspect.signature(self.fn)  # the launch's options (num_warps, ...) are not the kernel's
        bound = signature.bind_partial(*args, **{k: v for k, v in kwargs.items() if k in signature.parameters}).arguments
        ranges = [(t.untyped_storage().data_ptr(), t.untyped_storage().data_ptr() + t.untyped_storage().nbytes(),
                   f"{name} {tuple(t.shape)}") for key, value in bound.items() for name, t in _tensors(key, value)]
        outer = state["kernel"], state["allowed"]
        state["kernel"], state["allowed"] = self.fn.__name__, _Ranges(ranges)
        try:
            return launch(self, *args, **kwargs)
        finally:
            state["kernel"], state["allowed"] = outer

    builder.create_masked_load, builder.create_masked_store, executor.__call__ = checked_load, checked_store, checked_launch
    try:
        yield
    except Exception:
        if state["problem"] is None:
            raise
        raise AssertionError(f"{what}: {state['problem']}" + (f"\n  convention: {convention}" if convention else "")) from None
    finally:
        builder.create_masked_load, builder.create_masked_store, executor.__call__ = load, store, launch
