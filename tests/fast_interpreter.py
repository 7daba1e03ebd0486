"""Triton's interpreter, with the cost of a @triton.jit helper call cut: the same semantics, faster.

Each call of a jit function from inside a kernel re-patches triton.language, and finds what to patch
with `inspect.getmembers` over the whole module: about a millisecond per call, most of a test's time
when a kernel calls a helper per tile. The names of the builtins never change, so they are listed once
per module. A module is patched whole and restored whole, so when its first builtin is already
patched (a helper called inside a kernel) the whole module is, and there is nothing to do; otherwise
each builtin is read and wrapped as the interpreter does.
"""
from __future__ import annotations

import inspect


def install() -> None:
    """Replace the interpreter's `_patch_builtin` with one that lists each module's builtins once.
    Leaves the interpreter as it is if this Triton lacks the functions it relies on."""
    from triton.language import core
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_builtin", None)
    patch_attr = getattr(interpreter, "_patch_attr", None)
    if original is None or patch_attr is None or getattr(original, "kata_fast", False):
        return
    names: dict[int, list[str]] = {}

    def patch_builtin(pkg, builder, scope):
        if id(pkg) not in names:  # first seen at a kernel's launch, before anything is patched
            names[id(pkg)] = [name for name, member in inspect.getmembers(pkg) if core.is_builtin(member)]
        builtins = names[id(pkg)]
        if builtins and not core.is_builtin(getattr(pkg, builtins[0])):
            return  # patched by the enclosing launch: the original would find no builtin to wrap
        for name in builtins:
            patch_attr(pkg, name, getattr(pkg, name), builder, scope)

    patch_builtin.kata_fast = True
    interpreter._patch_builtin = patch_builtin
