"""Alternative: a query block walks its partial blocks (with the mask) before its full ones, as FlexAttention does."""


def kv_blocks(block_mask, i):
    """Query block i's partial key blocks (masked True), then its full ones (masked False), each ascending."""
    partial = block_mask.kv_indices[i, :block_mask.kv_num_blocks[i]]
    full = block_mask.full_kv_indices[i, :block_mask.full_kv_num_blocks[i]]
    return [(int(j), True) for j in partial] + [(int(j), False) for j in full]
