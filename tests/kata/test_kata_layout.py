"""The kata's own files: every exercise has its solution, stub, test file, hints, mutants and alternatives."""
import re

import pytest

from kata.exercises import EXERCISES, EXERCISES_DIR, SOLUTIONS_DIR
from kata.dev.alternatives import load_alternatives
from kata.grader.hints import sections
from kata.dev.mutants import load_mutants

HINT_NUMBERS = re.compile(r"^## Hint (\d+)\s*$", re.MULTILINE)


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.stem)
def test_every_exercise_has_all_its_files(ex):
    """A new exercise half added: the grader would report it missing, or run it untested."""
    for path in (SOLUTIONS_DIR / ex.filename, EXERCISES_DIR / ex.filename, ex.test_file, ex.hint_file):
        assert path.is_file(), f"{ex.stem}: {path} is missing"


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.stem)
def test_hints_go_from_a_nudge_to_nearly_the_answer_in_three_to_five_steps(ex):
    """A hint file with a gap in its numbering, one hint only, or an empty section."""
    numbers = [int(n) for n in HINT_NUMBERS.findall(ex.hint_file.read_text(encoding="utf-8"))]
    assert numbers == list(range(1, len(numbers) + 1)), f"{ex.hint_file.name}: hints numbered {numbers}"
    assert 3 <= len(numbers) <= 5, f"{ex.hint_file.name}: {len(numbers)} hints, expected 3 to 5"
    assert all(sections(ex.hint_file)), f"{ex.hint_file.name}: an empty hint"


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.stem)
def test_every_exercise_has_at_least_eight_mutants_that_apply(ex):
    """Too few deliberately broken solutions to prove the tests bite, or one gone stale."""
    mutants = load_mutants(ex)
    assert len(mutants) >= 8, f"{ex.stem}: {len(mutants)} mutants, expected at least 8"
    for mutant in mutants:
        mutant.source()  # raises when its text no longer occurs once in the solution


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.stem)
def test_every_exercise_has_three_alternatives_that_say_how_they_differ(ex):
    """Too few correct solutions in other styles to prove the tests accept them, or one unexplained."""
    alternatives = load_alternatives(ex)
    assert len(alternatives) >= 3, f"{ex.stem}: {len(alternatives)} alternatives, expected at least 3"
    for alt in alternatives:
        assert alt.style.startswith("Alternative: "), f"{alt.path}: its docstring must open with 'Alternative: '"
