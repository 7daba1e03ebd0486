"""Alternative: block_sizes by search: block_q counted up to ⌈M/4d⌉, block_k down until the walk fits.

block_k starts at min(block_q, d) and drops until a Q block and a K and a V tile fit in M; when not
even one row fits, that is the ValueError."""


def block_sizes(M: int, d: int) -> tuple[int, int]:
    """(block_q, block_k) for an SRAM of M elements and head dimension d: the paper's Algorithm 1,
    line 1, with query blocks outside, block_k cut so that flash_attention's walk fits in M."""
    if d < 1:
        raise ValueError(f"block_sizes(M={M}, d={d}): d must be at least 1")
    block_q = 1
    while 4 * d * block_q < M:
        block_q += 1
    block_k = min(block_q, d)
    while block_k > 0 and d * (block_q + 2 * block_k) > M:
        block_k -= 1
    if block_k == 0:
        raise ValueError(f"block_sizes(M={M}, d={d}): M holds no block of one row each of Q, K and V "
                         f"(M >= 3d = {3 * d})")
    return block_q, block_k
