"""FlashAttention Kata: the grader's own code and the learner's tools."""
