"""Alternative: both closed forms counted tile by tile in Python loops, as the kernels move the data."""
import numpy as np

from kata.given.hbm import HBM, blocks, causal_mask


def standard_attention(hbm: HBM, block_q: int, block_k: int, causal: bool = False,
                       scale: float | None = None) -> None:
    """Algorithm 0, three kernels on hbm's Q, K, V (n, d): S = scale·QKᵀ, P = softmax(S), both
    (n, n), then O = PV (n, d), each written to hbm."""
    n, d = hbm.shape("Q")
    scale = 1 / np.sqrt(d) if scale is None else scale
    all_keys = slice(0, n)
    for rows in blocks(n, block_q):  # kernel 1: S = scale·QKᵀ, one tile at a time
        with hbm.on_chip():
            q = scale * hbm.read("Q", rows)
            for keys in blocks(n, block_k):
                with hbm.on_chip():
                    k = hbm.read("K", keys)
                    hbm.write("S", rows, keys, q @ k.T)
    for rows in blocks(n, block_q):  # kernel 2: P = softmax(S), a block of full rows at a time
        with hbm.on_chip():
            s = hbm.read("S", rows, all_keys)
            if causal:
                s[~causal_mask(rows, all_keys)] = -np.inf
            p = np.exp(s - s.max(axis=1)[:, None])  # key 0 is live in every row: the max is finite
            p /= p.sum(axis=1)[:, None]
            hbm.write("P", rows, all_keys, p)
    for rows in blocks(n, block_q):  # kernel 3: O = PV
        o = 0
        for keys in blocks(n, block_k):
            with hbm.on_chip():
                p = hbm.read("P", rows, keys)
                o = o + p @ hbm.read("V", keys)
        hbm.write("O", rows, value=o)


def standard_attention_io(n: int, d: int, block_q: int, block_k: int,
                          causal: bool = False) -> tuple[int, int]:
    """(reads, writes) in elements of standard_attention on Q, K, V of shape (n, d)."""
    reads = writes = 0
    for rows in blocks(n, block_q):
        height = rows.stop - rows.start
        reads += height * d  # kernel 1 reads this Q block once
        for keys in blocks(n, block_k):
            width = keys.stop - keys.start
            reads += width * d  # kernel 1: the K tile
            writes += height * width  # kernel 1: the S tile
            reads += width * d + height * width  # kernel 3: the V rows and the P tile
        reads += height * n  # kernel 2: full rows of S
        writes += height * n + height * d  # kernel 2 writes P, kernel 3 writes O
    return reads, writes


def flash_attention(hbm: HBM, block_q: int, block_k: int, causal: bool = False,
                    scale: float | None = None) -> None:
    """FlashAttention-2's Algorithm 1 (query blocks outside) on hbm's Q, K, V (n, d): per query
    block, walk its key tiles keeping m, l and acc on chip, then write its rows of O (n, d) and
    L (n,) once."""
    n, d = hbm.shape("Q")
    scale = 1 / np.sqrt(d) if scale is None else scale
    for rows in blocks(n, block_q):
        with hbm.on_chip():
            q = hbm.read("Q", rows)
            m = np.full(rows.stop - rows.start, -np.inf)
            l = np.zeros(rows.stop - rows.start)
            acc = np.zeros((rows.stop - rows.start, d))
            for keys in blocks(n, block_k):
                if causal and keys.start > rows.stop - 1:
                    continue  # no query of the block reaches this tile's first key
                with hbm.on_chip():
                    s = scale * (q @ hbm.read("K", keys).T)
                    if causal:
                        s = np.where(causal_mask(rows, keys), s, -np.inf)
                    m_new = np.maximum(m, s.max(axis=1))
                    p = np.exp(s - m_new[:, None])
                    alpha = np.exp(m - m_new)  # rescales what was summed under the old max
                    v = hbm.read("V", keys)
                    l = alpha * l + p.sum(axis=1)
                    acc = alpha[:, None] * acc + p @ v
                    m = m_new
            hbm.write("O", rows, value=acc / l[:, None])
            hbm.write("L", rows, value=m + np.log(l))


def flash_attention_io(n: int, d: int, block_q: int, block_k: int,
                       causal: bool = False) -> tuple[int, int]:
    """(reads, writes) in elements of flash_attention on Q, K, V of shape (n, d)."""
    reads, writes = 0, 0
    for rows in blocks(n, block_q):
        reads += (rows.stop - rows.start) * d  # Q, once per query block
        for keys in blocks(n, block_k):
            if not causal or keys.start <= rows.stop - 1:  # scheduled: some pair in the tile may attend
                reads += 2 * (keys.stop - keys.start) * d  # the tile's K and V rows, whole
        writes += (rows.stop - rows.start) * (d + 1)  # its O rows and L values
    return reads, writes
