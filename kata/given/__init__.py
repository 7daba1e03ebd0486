"""The code exercises import and the learner reads but does not write: each function once, named after its idea."""
