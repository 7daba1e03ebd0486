"""Float64 oracles and input helpers shared by the tests of exercises 01-05.

Every oracle works from the definition, in float64, with no exercise's method in it: the
log-sum-exp by pairwise logaddexp (no max shift), attention from the dense matrix of scores with
the pairs that may not attend set to -inf (no tiles, no running max, no merge). `watch` wraps an
input so that a test can see which of its elements the code under test read, and in what order.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

DTYPES = pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
# float32 keeps about 7 digits; a few roundings per element cost a few units of 1e-7.
TOL = {np.float32: dict(rtol=5e-5, atol=2e-6), np.float64: dict(rtol=1e-10, atol=1e-12)}


# ---- oracles ------------------------------------------------------------------------------------

def logsumexp(x):
    """log(sum(exp(x))) over the last axis in float64 by pairwise logaddexp: no max shift anywhere."""
    return np.logaddexp.reduce(np.asarray(x, np.float64), axis=-1)


def softmax(x):
    """exp(x - lse) over the last axis in float64; a fully masked row (lse = -inf) weighs nothing."""
    x = np.asarray(x, np.float64)
    lse = np.asarray(logsumexp(x))[..., None]
    with np.errstate(invalid="ignore"):  # -inf - (-inf) on a fully masked row, replaced just below
        p = np.exp(x - lse)
    return np.where(np.isneginf(lse), 0.0, p)


def allowed_pairs(n_q, n_k, causal=False, mask=None):
    """True where query i may attend key j: the explicit mask AND (if causal) j <= i, top-left aligned."""
    allowed = np.ones((n_q, n_k), bool) if mask is None else np.array(mask, bool)
    if causal:
        allowed &= np.tri(n_q, n_k, dtype=bool)  # ones where j <= i
    return allowed


def scores(q, k, scale=None):
    """S = scale · q kᵀ in float64; scale defaults to 1/sqrt(d) only when it is None."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    return (1 / math.sqrt(q.shape[-1]) if scale is None else scale) * (q @ k.T)


def weights(q, k, allowed=None, scale=None):
    """(P, lse): softmax of each row of scores over the allowed pairs, and its log-sum-exp."""
    s = scores(q, k, scale)
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    return softmax(s), logsumexp(s)  # lse = -inf where a row has no live key, also when n_k = 0


def attention(q, k, v, allowed=None, scale=None):
    """(o, lse) of dense attention in float64; a row with no live key gives (0, -inf)."""
    p, lse = weights(q, k, allowed, scale)
    return p @ np.asarray(v, np.float64), lse


# ---- inputs -------------------------------------------------------------------------------------

def random_qkv(rng, n_q, n_k, d, d_v, dtype=np.float64):
    """Standard normal q (n_q, d), k (n_k, d), v (n_k, d_v)."""
    return tuple(rng.standard_normal(shape).astype(dtype) for shape in [(n_q, d), (n_k, d), (n_k, d_v)])


def scores_with_masked_keys(rng, rows, cols, offset, live_col):
    """Scores near `offset`, about 40% of them -inf (masked keys); column `live_col` stays live."""
    x = offset + rng.standard_normal((rows, cols))
    x[rng.random((rows, cols)) < 0.4] = -np.inf
    x[:, live_col] = offset + rng.standard_normal(rows)  # every row keeps a live score
    return x


def with_offsets(q, k, row_offset, key_offset, scale):
    """Append two columns so that score s_ij gains row_offset_i + key_offset_j exactly (for this scale)."""
    n_q, n_k = len(q), len(k)
    q = np.hstack([q, np.asarray(row_offset, float)[:, None] / scale, np.ones((n_q, 1))])
    k = np.hstack([k, np.ones((n_k, 1)), np.asarray(key_offset, float)[:, None] / scale])
    return q, k


def case_id(causal=False, **sizes):
    """`nq5-nk7-bq2-bk3-causal`: a test case named by its sizes."""
    return "-".join(f"{name}{size}" for name, size in sizes.items()) + ("-causal" if causal else "")


def dims_id(shape):
    """`2x3x7`: an array's shape as a test id."""
    return "x".join(map(str, shape))


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
