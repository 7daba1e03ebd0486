"""The code exercises import and the learner reads but does not write: each function once, named after its idea.

    hbm      the simulated GPU memory of exercises 05 and 08, and the row blocks they walk
    solved   an exercise as solved in solutions/, for the later ones that build on it (07)
"""
