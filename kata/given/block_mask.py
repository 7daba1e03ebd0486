"""A block mask in FlexAttention's layout: which tiles of the (query, key) grid are computed, and how.

Exercise 12 builds one from a mask_mod and walks it in NumPy; exercise 13 walks the same layout
in a Triton kernel. T_r = ceil(n_q / block_q) query blocks, T_c = ceil(n_k / block_k) key blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BlockMask:
    """Per query block i (forward): `kv_num_blocks[i]` partial key blocks, listed ascending in
    `kv_indices[i, :kv_num_blocks[i]]` (some pair masked: the mask is applied there), and
    `full_kv_num_blocks[i]`, `full_kv_indices[i, :...]` (every pair may attend: no mask).
    Per key block j (the backward's walk), the same transposed: `q_num_blocks[j]`, `q_indices[j]`,
    `full_q_num_blocks[j]`, `full_q_indices[j]`. Entries past a count mean nothing: never read them.
    """
    n_q: int
    n_k: int
    block_q: int
    block_k: int
    kv_num_blocks: np.ndarray       # (T_r,) int
    kv_indices: np.ndarray          # (T_r, T_c) int
    full_kv_num_blocks: np.ndarray  # (T_r,) int
    full_kv_indices: np.ndarray     # (T_r, T_c) int
    q_num_blocks: np.ndarray        # (T_c,) int
    q_indices: np.ndarray           # (T_c, T_r) int
    full_q_num_blocks: np.ndarray   # (T_c,) int
    full_q_indices: np.ndarray      # (T_c, T_r) int
    # Exercise 13's program order, not FlexAttention's: the blocks by list length (partial + full), longest first
    kv_order: np.ndarray | None = None  # (T_r,) int: query blocks, for the forward and dQ
    q_order: np.ndarray | None = None   # (T_c,) int: key blocks, for dK, dV
