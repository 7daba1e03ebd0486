"""kata/dev/splice.py: an alternative's definitions replace its solution's by name."""
import pytest

from kata.dev.splice import SpliceError, splice

SOLUTION = '''"""The lesson."""
import numpy as np

SCALE = 2


def helper(x):
    return x


def answer(x):
    """Twice x."""
    # BEGIN SOLUTION
    return SCALE * helper(x)
    # END SOLUTION
'''


def run(source: str):
    namespace: dict = {}
    exec(compile(source, "<spliced>", "exec"), namespace)
    return namespace


def test_a_definition_replaces_the_solutions_of_its_name_and_the_rest_stays():
    """A splice that drops the lesson or the given glue, or appends instead of replacing."""
    spliced = splice(SOLUTION, '"""Alternative: by addition."""\n\n\ndef answer(x):\n    return x + x\n')
    assert spliced.startswith('"""The lesson."""') and spliced.count("def answer") == 1
    assert "def helper" in spliced and "BEGIN SOLUTION" not in spliced and run(spliced)["answer"](3) == 6


def test_new_names_come_before_the_first_replaced_definition_and_new_imports_after_the_solutions():
    """A new helper placed after module-level code that needs it, or an import lost."""
    alternative = ('"""Alternative: a table."""\nimport math\n\nTABLE = {3: 6}\n\n\n'
                   'def answer(x):\n    return TABLE.get(x, math.nan)\n')
    spliced = splice(SOLUTION, alternative)
    assert spliced.index("import math") < spliced.index("SCALE = 2") < spliced.index("TABLE =") \
        < spliced.index("def answer")
    assert run(spliced)["answer"](3) == 6


def test_a_copy_of_the_solutions_own_definition_is_refused():
    """An alternative that carries a solution function unchanged: a copy that would drift."""
    with pytest.raises(SpliceError, match="helper is the solution's own"):
        splice(SOLUTION, '"""Alternative: x."""\n\n\ndef helper(x):\n    """Other words."""\n    return x\n')


def test_only_imports_and_whole_definitions_can_be_spliced():
    """Loose statements would run at a place the alternative cannot choose."""
    with pytest.raises(SpliceError, match="only imports and whole definitions"):
        splice(SOLUTION, '"""Alternative: x."""\nprint("hello")\n')


def test_an_import_adds_only_the_names_the_solution_does_not_import():
    """A name imported twice (pyflakes: redefinition), or a name the alternative needs left out."""
    solution = SOLUTION.replace("import numpy as np\n", "from math import pi\n")
    spliced = splice(solution, '"""Alternative: x."""\nfrom math import pi, tau\n\n\ndef answer(x):\n    return tau / pi * x\n')
    assert spliced.count("from math import pi\n") == 1 and "from math import tau\n" in spliced
    assert run(spliced)["answer"](3) == 6
