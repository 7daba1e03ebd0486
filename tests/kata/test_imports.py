"""The kata's imports point down its layers, never round in a circle, and never at a private name.

Layers, bottom to top, each for one audience; a module imports from its own layer or below, also
inside a function (a lazy import is still a dependency):
    base    kata.exercises, kata.gpu, kata.unfinished, kata.given.* (the code exercises import: only
            kata.given itself and the exercise list)
    tools   kata.tools.*, kata.ring (the learner's tools)
    bench   kata.bench.* (the benchmarks)
    grader  kata.grader.*
    dev     kata.dev.* (the maintainers' tools)
    entry   grader.py
A name with a leading underscore is its module's own: another module that imports it (or reads it as
`module._name`) breaks when the owner changes it, and says that the name belongs in a shared place.
"""
from __future__ import annotations

import ast
from fnmatch import fnmatchcase
from typing import NamedTuple

from kata.exercises import ROOT

LAYERS = (
    ("base", ("kata", "kata.exercises", "kata.gpu", "kata.unfinished", "kata.given", "kata.given.*")),
    ("tools", ("kata.tools", "kata.tools.*", "kata.ring")),
    ("bench", ("kata.bench", "kata.bench.*")),
    ("grader", ("kata.grader", "kata.grader.*")),
    ("dev", ("kata.dev", "kata.dev.*")),
    ("entry", ("grader",)),
)
# A sealed package imports only itself and the modules listed: what exercises import stands on
# nothing else of the kata but the exercise list, through which kata.given.solved loads a solution.
SEALED = {"kata.given": (("kata.exercises",), "the code exercises import stands on nothing else of the kata")}


class Import(NamedTuple):
    module: str  # the importing module
    target: str  # the kata module it imports
    line: int
    private: str | None  # a private name it takes from `target`, if any


def kata_sources() -> dict[str, str]:
    """Module name -> source, for every module under kata/ and grader.py."""
    sources = {"grader": (ROOT / "grader.py").read_text(encoding="utf-8")}
    for path in sorted((ROOT / "kata").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        sources[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path.read_text(encoding="utf-8")
    return sources


def ours(name: str) -> bool:
    return name in ("kata", "grader") or name.startswith("kata.")


def package_of(module: str, sources: dict[str, str]) -> str:
    """The package that a relative import in `module` starts from."""
    is_package = any(other.startswith(module + ".") for other in sources)
    return module if is_package else module.rpartition(".")[0]


def imports(module: str, sources: dict[str, str]) -> list[Import]:
    """Every import of a kata module in `module`'s source, at any depth, with the private names it takes."""
    found, bound = [], {}  # bound: local name -> the kata module it stands for
    tree = ast.parse(sources[module], filename=module)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if ours(alias.name):
                    found.append(Import(module, alias.name, node.lineno, None))
                    if alias.asname:
                        bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = package_of(module, sources).split(".")
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            if not ours(base):
                continue
            for alias in node.names:
                if f"{base}.{alias.name}" in sources:  # a submodule
                    found.append(Import(module, f"{base}.{alias.name}", node.lineno, None))
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
                else:
                    private = alias.name if alias.name.startswith("_") else None
                    found.append(Import(module, base, node.lineno, private))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(Import(module, bound[node.value.id], node.lineno, node.attr))
    return found


def layer(module: str) -> int | None:
    """The index in LAYERS of `module`'s layer; None for a module no layer names."""
    return next((i for i, (_, patterns) in enumerate(LAYERS) if any(fnmatchcase(module, p) for p in patterns)),
                None)


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    done, path = set(), []

    def visit(node):
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if found := visit(nxt):
                return found
        path.pop()
        done.add(node)
        return None

    return next((found for node in sorted(graph) if (found := visit(node))), None)


def problems(sources: dict[str, str]) -> list[str]:
    """What breaks the layering in `sources` (module name -> source), one line each; [] when nothing."""
    out = [f"{m}: in no layer; add its folder to LAYERS in tests/kata/test_imports.py" for m in sources
           if layer(m) is None]
    graph = {m: set() for m in sources}
    for module in sources:
        for imp in imports(module, sources):
            where = f"{imp.module} (line {imp.line})"
            if imp.target not in sources:
                out.append(f"{where} imports {imp.target}, which does not exist")
                continue
            if imp.target != module:
                graph[module].add(imp.target)
            if imp.private:
                out.append(f"{where} takes the private name {imp.private} from {imp.target}: make it public "
                           f"there, or move it to a module both can import")
            mine, theirs = layer(module), layer(imp.target)
            if None not in (mine, theirs) and theirs > mine:
                out.append(f"{where} imports {imp.target} upward: the {LAYERS[mine][0]} layer sits below the "
                           f"{LAYERS[theirs][0]} layer; move the shared code down")
            for sealed, (allowed, why) in SEALED.items():
                inside = module == sealed or module.startswith(sealed + ".")
                if inside and not (imp.target in (sealed, *allowed) or imp.target.startswith(sealed + ".")):
                    out.append(f"{where} imports {imp.target}: {sealed} imports only {sealed}.* and {', '.join(allowed)}, "
                               f"since {why}")
    if found := cycle(graph):
        out.append("import cycle: " + " -> ".join(found))
    return out


def test_the_kata_imports_point_down_without_cycles_or_private_names():
    found = problems(kata_sources())
    assert not found, "the kata's imports break its layering:\n" + "\n".join(found)


# ---- the checks themselves, on made-up modules -----------------------------------------------------

def test_a_cycle_is_caught_also_through_a_lazy_or_relative_import():
    found = problems({"kata.tools": "", "kata.tools.a": "from . import b\n",
                      "kata.tools.b": "def f():\n    import kata.tools.a\n"})
    assert found == ["import cycle: kata.tools.a -> kata.tools.b -> kata.tools.a"]


def test_an_upward_import_is_caught_also_inside_a_function():
    found = problems({"kata.gpu": "def probe():\n    from kata.grader import doctor\n", "kata.grader.doctor": ""})
    assert len(found) == 1 and found[0].startswith("kata.gpu (line 2) imports kata.grader.doctor upward")


def test_the_given_library_imports_only_itself():
    found = problems({"kata.given.hbm": "from kata.gpu import NO_GPU\n", "kata.gpu": "NO_GPU = 1\n",
                      "kata.given.checks": "from kata.given.hbm import HBM\n"})
    assert found == ["kata.given.hbm (line 1) imports kata.gpu: kata.given imports only kata.given.* and kata.exercises, "
                     "since " + SEALED["kata.given"][1]]


def test_a_private_name_taken_from_another_module_is_caught():
    found = problems({"kata.bench.forward": "def _guarded(): ...\n",
                      "kata.bench.paper": "from kata.bench.forward import _guarded\n",
                      "kata.bench.decode": "from kata.bench import forward as f\nf._guarded()\nf.__doc__\n",
                      "kata.tools.io_report": "def _io(): ...\n",
                      "kata.bench.main": "import kata.tools.io_report as io\nio._io()\n"})
    assert [line.split(":")[0] for line in found] == [
        "kata.bench.paper (line 1) takes the private name _guarded from kata.bench.forward",
        "kata.bench.decode (line 2) takes the private name _guarded from kata.bench.forward",
        "kata.bench.main (line 2) takes the private name _io from kata.tools.io_report"]


def test_a_module_outside_the_layers_and_a_missing_module_are_named():
    found = problems({"kata.newpart.x": "from kata.tools import gone\n"})
    assert found == ["kata.newpart.x: in no layer; add its folder to LAYERS in tests/kata/test_imports.py",
                     "kata.newpart.x (line 1) imports kata.tools, which does not exist"]
