"""The stub generator: exercises/ is made from solutions/, block by block."""
import ast

import pytest

from kata.dev.stubs import expected_stubs
from kata.grader.stub import make_stub

SOLUTION = '''def f(x):
    """Doc."""
    # TODO: double it.
    # BEGIN SOLUTION
    y = 2 * x
    return y
    # END SOLUTION


class C:
    def g(self):
        if True:
            # BEGIN SOLUTION
            return 1
            # END SOLUTION
'''


def test_each_block_becomes_one_raise_at_its_indentation():
    """A stub keeps the lesson, the TODO and the signature, and raises where the solution was."""
    stub = make_stub(SOLUTION)
    assert stub.splitlines()[:4] == [
        "def f(x):", '    """Doc."""', "    # TODO: double it.",
        '    raise NotImplementedError("f: replace this line with your code")']
    assert '            raise NotImplementedError("g: replace this line with your code")' in stub
    assert "2 * x" not in stub and "return 1" not in stub


@pytest.mark.parametrize("broken, problem", [
    ("def f():\n    # BEGIN SOLUTION\n    pass\n", "never closed"),
    ("def f():\n    pass\n    # END SOLUTION\n", "without"),
    ("def f():\n    # BEGIN SOLUTION\n    # BEGIN SOLUTION\n", "inside the block"),
    ("# BEGIN SOLUTION\nx = 1\n# END SOLUTION\n", "inside a function"),
])
def test_malformed_markers_are_refused(broken, problem):
    """A typo in a marker must stop the generator, not leak the solution into the stub."""
    with pytest.raises(ValueError, match=problem):
        make_stub(broken)



def unused_imports(source: str) -> list[str]:
    """Names a module imports and never uses."""
    tree = ast.parse(source)
    imported = {(alias.asname or alias.name).split(".")[0] for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    return sorted(imported - used)


@pytest.mark.parametrize("filename", sorted(expected_stubs()))
def test_stubs_use_every_import(filename):
    """An import only the solution's code used: the learner's stub starts with an unused import."""
    assert not unused_imports(expected_stubs()[filename]), (
        f"exercises/{filename} imports {unused_imports(expected_stubs()[filename])} but never uses them: "
        f"use them in given code, or import inside the solution block")
