"""Spies on the code under test: inputs that log what is read of them, functions that log their calls.

`watch` wraps a NumPy input so that a test can see which of its elements the code under test read,
and in what order. `record_calls` wraps a function of the exercise module so that a test can see
what each call was given, however the learner passed the arguments (by position or by name).
"""
from __future__ import annotations

import inspect

import numpy as np

from checks import NotChecked


class Calls(list):
    """What record_calls kept of each call; `unseen` says why no call can be seen, else None."""
    unseen: str | None = None


def record_calls(monkeypatch, module, name, keep, reads=()) -> Calls:
    """Replace module.name by a wrapper that appends keep(arguments by name) for each call, then calls
    through; returns the list. `keep` copies what it keeps if the caller may change it afterwards.

    `name` is a helper the stub defines; code that does without it (another split of the work, a
    function of its own) or gives it other parameters than `reads` (those a check reads) is left as
    it is, and the Calls say why: the rule is then not checked (see `observed`). A @triton.jit
    helper records each call to it, also under another name (`walk = _dq_tiles`)."""
    calls = Calls()
    function = getattr(module, name, None)
    if function is None:
        calls.unseen = f"your file has no {name} (the stub's helper the check watches)"
        return calls
    signature = inspect.signature(getattr(function, "fn", function))  # a @triton.jit function: its Python one
    if missing := [p for p in reads if p not in signature.parameters]:
        calls.unseen = f"your {name} has no parameter {missing[0]} (the stub's, which the check reads)"
        return calls

    if inspect.isfunction(function):  # plain Python: calls through the module's name are seen
        def recorded(*args, **kwargs):
            calls.append(keep(signature.bind(*args, **kwargs).arguments))
            return function(*args, **kwargs)

        monkeypatch.setattr(module, name, recorded)
        return calls

    class Recorded(type(function)):  # a @triton.jit helper: the object records, under any name it is called by
        def __call__(self, *args, **kwargs):
            calls.append(keep(signature.bind(*args, **kwargs).arguments))
            return super().__call__(*args, **kwargs)

    monkeypatch.setattr(function, "__class__", Recorded)
    return calls


def observed(rule: str, recorded: dict[str, Calls]) -> None:
    """Raise NotChecked, naming `rule` and why, unless each helper in `recorded` (a name in a message:
    its Calls) was seen called. Where some helpers may be seen and others not, call it after checking
    the calls that were seen, so that those are held to the rule."""
    if why := [calls.unseen or f"{name} was never called (your code does its work without it)"
               for name, calls in recorded.items() if calls.unseen or not calls]:
        raise NotChecked(rule, "; ".join(why))


def reads_observed(rule: str, **watched: Watched) -> None:
    """Raise NotChecked, naming `rule`, unless some read of each watched input was seen: code that
    converts an input first (np.asarray, np.array) reads a plain array, out of sight. Call it after
    checking the reads that were seen."""
    if unseen := [name for name, a in watched.items() if not a.log]:
        raise NotChecked(rule, f"{' and '.join(unseen)} converted before being read (np.asarray and np.array hand "
                               f"back a plain array, whose reads cannot be seen; NumPy inputs need no conversion)")


def asked_outside(asked, flagged, block_q, block_k):
    """The first (rows, cols, (i, j)) among `asked` (slice pairs a mask function was called with) that
    lies within one tile not in `flagged`; None if there is none. A question about a larger region,
    such as the whole grid at once, is not judged: it is not one unmasked tile paying for the mask."""
    for rows, cols in asked:
        i, j = rows.start // block_q, cols.start // block_k
        in_one_tile = (rows.stop - 1) // block_q == i and (cols.stop - 1) // block_k == j
        if in_one_tile and (i, j) not in flagged:
            return rows, cols, (i, j)
    return None


# ---- watching what the code under test reads ----------------------------------------------------

def watch(a):
    """A view of `a` that records, in `.log`, the flat indices into `a` of what each operation reads."""
    watched = np.asarray(a).view(Watched)
    watched.record = _Record()
    watched.record.add(watched, np.arange(watched.size).reshape(watched.shape))
    return watched


def _places(a):
    """Where each element of `a` lies in memory, in elements from its first one (strides followed)."""
    place = np.zeros(a.shape, np.int64)
    for axis, (size, stride) in enumerate(zip(a.shape, a.strides)):
        shape = [1] * a.ndim
        shape[axis] = size
        place = place + np.arange(size).reshape(shape) * (stride // a.itemsize)
    return place


class _Record:
    """The log of one watched input, and the memory (the input, and copies of it) it can be read from."""

    def __init__(self):
        self.log = []
        self._memory = []  # (first byte, itemsize, original index by place in memory, the array kept alive)

    def add(self, a, index):
        place = _places(a)
        low = int(place.min())
        table = np.full(int(place.max()) - low + 1, -1)
        table[place - low] = index
        self._memory.append((a.__array_interface__["data"][0] + low * a.itemsize, a.itemsize, table, a))

    def index(self, a):
        """Indices into the original of `a`'s elements, or None where `a` is not watched memory."""
        if a.size == 0:
            return None
        address = a.__array_interface__["data"][0]
        for start, itemsize, table, _ in reversed(self._memory):
            offset, rest = divmod(address - start, itemsize)
            if itemsize != a.itemsize or rest or not 0 <= offset < len(table):
                continue
            place = offset + _places(a)
            if place.min() >= 0 and place.max() < len(table) and (table[place] >= 0).all():
                return table[place]
        return None


def _plain(obj):
    """`obj` with every Watched array in it (also inside lists and tuples) seen as a plain ndarray."""
    if isinstance(obj, Watched):
        return obj.view(np.ndarray)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(o) for o in obj)
    if isinstance(obj, dict):
        return {key: _plain(o) for key, o in obj.items()}
    return obj


def _read(*objs):
    """Log a read of every Watched array in `objs` (also inside lists, tuples and dicts)."""
    for obj in objs:
        if isinstance(obj, Watched):
            obj.log_read()
        elif isinstance(obj, (list, tuple)):
            _read(*obj)
        elif isinstance(obj, dict):
            _read(*obj.values())


# NumPy functions that only look at shapes, or make views: a view is followed through its memory.
_VIEWS = {np.shape, np.ndim, np.size, np.result_type, np.reshape, np.ravel, np.transpose, np.swapaxes,
          np.moveaxis, np.squeeze, np.expand_dims, np.atleast_1d, np.atleast_2d, np.atleast_3d,
          np.broadcast_to, np.shares_memory, np.may_share_memory}
_NEW = {np.empty_like, np.zeros_like, np.ones_like, np.full_like}  # new arrays shaped like the input


class Watched(np.ndarray):
    """An input whose reads are logged. A read is one NumPy operation taking it (or a view or copy of
    it) in: a ufunc or ufunc method (x.max(), np.exp, -, @), any np.* function (np.sort, np.where,
    np.take_along_axis, ...), a method that reads without a ufunc (argmax, sort, tolist, ...), or one
    element taken by indexing (also by a Python loop over it). Copies made by astype, copy, np.copy
    or fancy indexing are watched too. Not seen: np.asarray and np.array, which hand back a plain
    array, and other copies (flatten, ravel or reshape of a non-contiguous view)."""

    def __array_finalize__(self, obj):
        self.record = getattr(obj, "record", None)

    @property
    def log(self):
        return self.record.log

    def original_index(self):
        return None if self.record is None else self.record.index(self)

    def log_read(self, item=...):
        index = self.original_index()
        if index is not None:
            self.record.log.append(np.atleast_1d(index[item]))

    def _follow(self, copy, index):
        """Watch a copy of (part of) self: its reads are reads of the original elements it holds."""
        if isinstance(copy, Watched) and copy.size and index is not None and copy.original_index() is None:
            copy.record.add(copy, index)
        return copy

    def astype(self, *args, **kwargs):
        return self._follow(super().astype(*args, **kwargs), self.original_index())

    def copy(self, *args, **kwargs):
        return self._follow(super().copy(*args, **kwargs), self.original_index())

    def __getitem__(self, item):
        out = super().__getitem__(item)
        if not isinstance(out, np.ndarray):  # one element, as a NumPy scalar
            self.log_read(_plain(item))
        elif out.size and out.original_index() is None:  # fancy indexing made a copy
            index = self.original_index()
            self._follow(out, None if index is None else index[_plain(item)])
        return out

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        _read(inputs, {key: value for key, value in kwargs.items() if key != "out"})
        return getattr(ufunc, method)(*_plain(inputs), **_plain(kwargs))

    def __array_function__(self, func, types, args, kwargs):
        if func in _VIEWS:
            return super().__array_function__(func, types, args, kwargs)
        if func is np.copy and isinstance(args[0], Watched):
            return args[0].copy()
        if func not in _NEW:
            _read(args, kwargs)
        return func(*_plain(args), **_plain(kwargs))


def _reads_first(name):
    def method(self, *args, **kwargs):
        self.log_read()
        return getattr(self.view(np.ndarray), name)(*args, **kwargs)
    method.__name__ = name
    return method


for _name in ("argmax", "argmin", "argsort", "argpartition", "sort", "partition", "take", "tolist", "item",
              "nonzero", "searchsorted"):
    setattr(Watched, _name, _reads_first(_name))
