"""Splice an alternative's definitions into its solution by name, so an alternative holds only what differs.

An alternative (alternatives/NN_name/style.py) is a docstring saying how it differs, the imports it
needs, and whole top-level definitions (functions, classes, constants). Each one replaces the
solution's definition of the same name, in place; a name the solution lacks is added just before
the first definition the alternative replaces, so whatever replaces it can use it at import time.
Everything else, the lesson and the given glue included, comes from the solution as it is today:
an alternative cannot drift from a solution it does not copy.
"""
from __future__ import annotations

import ast


class SpliceError(ValueError):
    """An alternative that cannot be spliced: a statement that is not a definition, or a copy."""


def _name(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return None


def _lines(node: ast.stmt) -> tuple[int, int]:
    """0-based [start, end) of the node's source lines, its decorators included."""
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return start - 1, node.end_lineno


def _without_docstrings(node: ast.AST) -> str:
    """The node's meaning: a definition that differs only in its docstring is the same definition."""
    node = ast.parse(ast.unparse(node)).body[0]
    for sub in ast.walk(node):
        body = getattr(sub, "body", None)
        if isinstance(body, list) and body and _is_docstring(body[0]):
            sub.body = body[1:] or [ast.Pass()]
    return ast.dump(node)


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def splice(solution: str, alternative: str, filename: str = "<alternative>") -> str:
    """The solution's text with the alternative's definitions in place of the solution's own."""
    sol_tree, alt_tree = ast.parse(solution), ast.parse(alternative, filename)
    sol_lines, alt_lines = solution.splitlines(keepends=True), alternative.splitlines(keepends=True)
    defined = {_name(node): node for node in sol_tree.body if _name(node)}
    sol_imports = {ast.unparse(node) for node in sol_tree.body if isinstance(node, ast.Import)}
    sol_imported = {(node.module, alias.name, alias.asname) for node in sol_tree.body
                    if isinstance(node, ast.ImportFrom) for alias in node.names}
    imports, replaced, added = [], {}, []
    for node in alt_tree.body:
        if node is alt_tree.body[0] and _is_docstring(node):
            continue
        start, end = _lines(node)
        text = "".join(alt_lines[start:end])
        if isinstance(node, ast.ImportFrom):  # only the names the solution does not import already
            new = [a for a in node.names if (node.module, a.name, a.asname) not in sol_imported]
            if new:
                imports.append(ast.unparse(ast.ImportFrom(node.module, new, node.level)) + "\n")
        elif isinstance(node, ast.Import):
            if ast.unparse(node) not in sol_imports:
                imports.append(text)
        elif (name := _name(node)) is None:
            raise SpliceError(f"{filename}:{node.lineno}: only imports and whole definitions can be spliced")
        elif name in defined:
            if _without_docstrings(node) == _without_docstrings(defined[name]):
                raise SpliceError(f"{filename}:{node.lineno}: {name} is the solution's own: leave it out")
            replaced[name] = text
        else:
            added.append(text)
    if not replaced and not added:
        raise SpliceError(f"{filename}: defines nothing that differs from the solution")
    text = list(sol_lines)
    targets = [node for node in sol_tree.body if _name(node) in replaced]
    for node in reversed(targets):  # from the bottom up, so the line numbers above stay true
        start, end = _lines(node)
        text[start:end] = [replaced[_name(node)]]
    first = _lines(targets[0])[0] if targets else len(text)
    if added:  # before the first replaced definition, which may use them at import time
        text[first:first] = ["\n\n".join(added) + "\n\n\n"]
    imports_end = max((n.end_lineno for n in sol_tree.body if isinstance(n, (ast.Import, ast.ImportFrom))), default=0)
    if first < imports_end:
        raise SpliceError(f"{filename}: the solution defines {min(replaced)} above its imports")
    text[imports_end:imports_end] = imports
    return "".join(text)
