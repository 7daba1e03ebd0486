"""Triton's interpreter, with the cost of a @triton.jit helper call cut: the same semantics, faster.

Each call of a jit function from inside a kernel re-patches triton.language: it scans the function's
globals for the language modules, then finds what to patch in each with `inspect.getmembers` over
the whole module, about a millisecond per call, most of a test's time when a kernel calls a helper
per tile. The names of the builtins never change, so they are listed once per module, and a
function's language modules once per function. A module is patched whole and restored whole, so
when its first builtin is already patched (a helper called inside a kernel) the whole module is,
and there is nothing to do; otherwise each builtin is read and wrapped as the interpreter does.

Every operation also asks for its NumPy dtype through a function that builds a table of nineteen
dtypes per call; the answers, which depend on the element type alone, are kept.

And every 32-bit integer add, sub and mul is done twice: once more in 64 bits, to assert that the
result fits. The interpreter's assertions are off (its options' `debug` is always False), so the
assertion, and the copy it checks, are thrown away; a quarter of a kernel test's time went there.
The check is turned off only while `debug` is False, so nothing it could report is lost.

Every operation's result is a new tl.tensor, whose constructor turns its shape into a tl.tuple of
constexprs and types each entry, and most make a new block_type, which checks, converts and names
its shape again: a fifth of a kernel test's time. What follows from a shape of plain ints alone is
kept per shape (constexprs are never changed once made); each object still gets its own tuple, and
any other shape goes through Triton's own constructor, errors and all.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import weakref


def install() -> None:
    """Replace the interpreter's `_patch_builtin`, `_patch_lang` and `_get_np_dtype` with versions
    that remember what never changes. Leaves the interpreter as it is if this Triton lacks the
    functions they rely on."""
    from triton.language import core
    from triton.runtime import interpreter

    functions = [getattr(interpreter, name, None) for name in ("_patch_builtin", "_patch_attr", "_patch_lang",
                                                              "_get_np_dtype", "_LangPatchScope")]
    if None in functions or getattr(functions[0], "kata_fast", False):
        return
    _, patch_attr, patch_lang, get_np_dtype, scope_class = functions
    patch_attr = _direct_calls(core, getattr(interpreter, "interpreter_semantic", None)) or patch_attr
    names: dict[int, list[str]] = {}

    def is_patched(pkg) -> bool:
        if id(pkg) not in names:  # first seen at a kernel's launch, before anything is patched
            names[id(pkg)] = [name for name, member in inspect.getmembers(pkg) if core.is_builtin(member)]
        builtins = names[id(pkg)]
        return bool(builtins) and not core.is_builtin(getattr(pkg, builtins[0]))

    def patch_builtin(pkg, builder, scope):
        if is_patched(pkg):
            return  # patched by the enclosing launch: the original would find no builtin to wrap
        for name in names[id(pkg)]:
            patch_attr(pkg, name, getattr(pkg, name), builder, scope)

    languages = _languages()
    langs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # fn -> the language modules it sees

    def patch_lang_once(fn):
        if fn not in langs:
            langs[fn] = [value for value in fn.__globals__.values() if inspect.ismodule(value) and value in languages]
        if langs[fn] and all(is_patched(lang) for lang in langs[fn]):
            return scope_class()  # inside a launch that patched them: patching again changes nothing
        return patch_lang(fn)

    dtypes: dict = {}

    def np_dtype(tt_dtype):
        key = tt_dtype.element_ty if isinstance(tt_dtype, core.block_type) else tt_dtype
        if isinstance(key, core.pointer_type):  # unhashable, and answered before the table is built
            return get_np_dtype(key)
        if key not in dtypes:
            dtypes[key] = get_np_dtype(tt_dtype)
        return dtypes[key]

    patch_builtin.kata_fast = True
    interpreter._patch_builtin = patch_builtin
    interpreter._patch_lang = patch_lang_once
    interpreter._get_np_dtype = np_dtype
    _skip_unasserted_overflow_checks(getattr(interpreter, "interpreter_builder", None))
    _keep_shapes(core)


def _skip_unasserted_overflow_checks(builder) -> None:
    """sanitize_overflow off where its assertion could never fire (debug off)."""
    options = getattr(builder, "options", None)
    if options is None or getattr(options, "debug", True) or not getattr(options, "sanitize_overflow", False):
        return
    builder.options = dataclasses.replace(options, sanitize_overflow=False)


def _direct_calls(core, semantic):
    """The interpreter's _patch_attr without its per-call cost, or None if this Triton lacks what it needs.

    Each builtin runs under a lambda that copies its keyword arguments into a new dict, dropping any
    `_semantic`, then adds the interpreter's; the builtin's own wrapper then checks that one was
    given. This sets it in the call's own dict, and calls the function under that check directly.
    """
    checking = getattr(core.builtin(lambda: None), "__code__", None)
    if semantic is None or checking is None:
        return None

    def patch_attr(obj, name, member, builder, scope):
        fn = member.__wrapped__ if getattr(member, "__code__", None) is checking else member

        def call(*args, **kwargs):
            kwargs["_semantic"] = semantic
            return fn(*args, **kwargs)

        scope.set_attr(obj, name, call)

    return patch_attr


def _keep_shapes(core) -> None:
    """tl.tensor and tl.block_type built from what their shape alone decides, kept per shape; left
    as they are if this Triton lacks what they are built from."""
    if not all(hasattr(core, name) for name in ("tuple", "tuple_type", "constexpr_type", "validate_block_shape")):
        return
    block_type_init, tensor_init = core.block_type.__init__, core.tensor.__init__
    ttuple, constexpr = core.tuple, core.constexpr
    block_shapes: dict[tuple, tuple] = {}  # ints -> (the shape tuple's type, its text, numel)
    tensor_shapes: dict[tuple, tuple] = {}  # ints -> (the shape's constexprs, their tuple's type, numel)

    def ints(shape) -> tuple | None:
        """A list or tl.tuple of ints or constexpr ints as a tuple of ints, else None."""
        if type(shape) is not list and type(shape) is not ttuple:
            return None
        values = []
        for entry in shape.values if type(shape) is ttuple else shape:
            value = entry.value if type(entry) is constexpr else entry
            if type(value) is not int:
                return None
            values.append(value)
        return tuple(values)

    def block_type(self, element_ty, shape):
        key = ints(shape)
        if not key:  # 0-d, or not plain ints: Triton's own checks say what is wrong
            return block_type_init(self, element_ty, shape)
        if key not in block_shapes:
            numel = core.validate_block_shape(key)
            block_shapes[key] = (core.tuple_type([core.constexpr_type(n) for n in key]), str([str(n) for n in key]),
                                 numel)
        shape_type, text, self.numel = block_shapes[key]
        self.element_ty = element_ty
        self.shape = ttuple(list(key), shape_type)
        self.name = f"<{text}, {element_ty}>"

    def tensor(self, handle, type):
        key = ints(type.shape) if type.is_block() else ()
        if key is None:
            return tensor_init(self, handle, type)
        if key not in tensor_shapes:
            values = [constexpr(n) for n in key]
            tensor_shapes[key] = (values, core.tuple_type([v.type for v in values]), constexpr(math.prod(key)))
        values, shape_type, self.numel = tensor_shapes[key]
        self.handle, self.type, self.dtype = handle, type, type.scalar
        self.shape = ttuple(values, shape_type)

    # A Triton whose constructors set other attributes than these would get objects it does not
    # expect: check one of each against its own first, and keep its own on any difference.
    if _same(core.block_type, block_type_init, block_type, (core.float32, [16, 32])) and _same(
            core.tensor, tensor_init, tensor, (None, core.block_type(core.float32, [16, 32]))):
        core.block_type.__init__, core.tensor.__init__ = block_type, tensor


def _same(cls, own, kept, args) -> bool:
    """Whether the constructors `own` and `kept` of `cls` give objects of the same attributes, each
    of the same type and text, on `args`."""
    made = []
    for init in (own, kept):
        obj = cls.__new__(cls)
        init(obj, *args)
        made.append({name: (type(value), str(value), str(getattr(value, "type", None)))
                     for name, value in vars(obj).items()})
    return made[0] == made[1]


def _languages() -> tuple:
    """The modules the interpreter patches when a function sees them: triton.language and its core."""
    import triton.language as tl
    return tl, tl.core
