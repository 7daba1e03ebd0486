"""The README's sentences that list exercises say what the exercise list says."""
import re

from kata.exercises import ROOT, format_numbers, numbers_where
from kata.grader.runner import COMPILED_FACTOR, GPU_FACTOR

README = ROOT / "README.md"


def test_the_readme_names_every_exercise_with_a_gpu_stage_where_it_lists_them():
    """A new Triton exercise (13) added to the list while the README still speaks of 06 alone."""
    text = re.sub(r"\s+", " ", README.read_text(encoding="utf-8"))  # sentences wrap anywhere
    gpu = format_numbers(numbers_where("needs_gpu"))
    for sentence in (f"exercises {gpu} run in Triton's interpreter on the CPU",
                     f"on macOS and Windows {gpu} are skipped and the other exercises work as usual",
                     f"{gpu} get {GPU_FACTOR} times as long in Triton's interpreter, {COMPILED_FACTOR} times on an "
                     "NVIDIA GPU",
                     f"the same tests of exercises {gpu} run compiled"):
        assert sentence in text, f"README.md should say: {sentence!r} (from kata/exercises.py)"
