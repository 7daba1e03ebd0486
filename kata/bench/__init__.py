"""The benchmarks a learner runs on a GPU (`python grader.py --bench ...`), one module each."""
