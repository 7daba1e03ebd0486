"""The grader: find, run, classify and report the exercises; progress, hints, reset, watch, doctor."""
