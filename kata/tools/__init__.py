"""The learner's tools: the tile schedule picture, the IO tables, the ring launcher."""
