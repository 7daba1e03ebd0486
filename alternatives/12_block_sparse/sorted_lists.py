"""Alternative: each row's listed blocks moved to its front by a stable argsort; kv_blocks chains two zips.

density counts the listed tiles with np.count_nonzero over the counts' ranges.
"""
import itertools

import numpy as np


def block_lists(listed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`listed (rows, cols)` bool -> (num_blocks (rows,), indices (rows, cols)): per row, how many
    columns are listed, and which, ascending, at the start of its row of indices."""
    # A stable sort on "not listed" keeps the listed columns first, in their own order.
    order = np.argsort(~listed, axis=1, kind="stable")
    return np.count_nonzero(listed, axis=1), order


def kv_blocks(block_mask, i: int) -> list[tuple[int, bool]]:
    """Query block i's key blocks as (j, masked): its full blocks (masked False), then its partial
    blocks (masked True), each ascending; j a Python int."""
    full = block_mask.full_kv_indices[i][:int(block_mask.full_kv_num_blocks[i])].tolist()
    partial = block_mask.kv_indices[i][:int(block_mask.kv_num_blocks[i])].tolist()
    return list(itertools.chain(zip(full, itertools.repeat(False)), zip(partial, itertools.repeat(True))))


def density(block_mask) -> float:
    """s: the fraction of the T_r x T_c tiles that are computed (partial or full)."""
    listed = sum(len(kv_blocks(block_mask, i)) for i in range(len(block_mask.kv_num_blocks)))
    return listed / (len(block_mask.kv_num_blocks) * len(block_mask.q_num_blocks))
