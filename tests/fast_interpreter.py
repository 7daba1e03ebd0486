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
"""
from __future__ import annotations

import dataclasses
import inspect
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


def _skip_unasserted_overflow_checks(builder) -> None:
    """sanitize_overflow off where its assertion could never fire (debug off)."""
    options = getattr(builder, "options", None)
    if options is None or getattr(options, "debug", True) or not getattr(options, "sanitize_overflow", False):
        return
    builder.options = dataclasses.replace(options, sanitize_overflow=False)


def _languages() -> tuple:
    """The modules the interpreter patches when a function sees them: triton.language and its core."""
    import triton.language as tl
    return tl, tl.core
