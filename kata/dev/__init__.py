"""The maintainers' tools: stub generation, mutants, alternatives."""
