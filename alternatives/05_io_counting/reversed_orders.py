"""Alternative: every kernel walks query blocks last to first; flash walks key tiles from the diagonal back.

Kernel 3 reads the V rows before the P tile; the running max starts at -inf with a guard for empty rows."""
import numpy as np

from kata.given.hbm import HBM, blocks, causal_mask


def standard_attention(hbm: HBM, block_q: int, block_k: int, causal: bool = False,
                       scale: float | None = None) -> None:
    """Algorithm 0, three kernels on hbm's Q, K, V (n, d): S = scale·QKᵀ, P = softmax(S), both
    (n, n), then O = PV (n, d), each written to hbm."""
    n, d = hbm.shape("Q")
    scale = 1 / np.sqrt(d) if scale is None else scale
    q_blocks = blocks(n, block_q)[::-1]  # any order of query blocks moves the same elements
    for rows in q_blocks:
        with hbm.on_chip():
            q = hbm.read("Q", rows)
            for keys in blocks(n, block_k)[::-1]:
                with hbm.on_chip():
                    k = hbm.read("K", keys)
                    hbm.write("S", rows, keys, scale * q @ k.T)
    every_key = slice(0, n)
    for rows in q_blocks:
        with hbm.on_chip():
            s = hbm.read("S", rows, every_key)
            keep = causal_mask(rows, every_key) if causal else np.ones(s.shape, bool)
            m = np.max(s, axis=1, where=keep, initial=-np.inf)[:, None]  # finite: key 0 is in every row
            e = np.exp(s - m, where=keep, out=np.zeros_like(s))  # masked pairs stay 0
            hbm.write("P", rows, every_key, e / e.sum(axis=1)[:, None])
    for rows in q_blocks:
        o = np.zeros((rows.stop - rows.start, d))
        for keys in blocks(n, block_k):
            with hbm.on_chip():
                v = hbm.read("V", keys)
                o += hbm.read("P", rows, keys) @ v
        hbm.write("O", rows, value=o)


def standard_attention_io(n: int, d: int, block_q: int, block_k: int,
                          causal: bool = False) -> tuple[int, int]:
    """(reads, writes) in elements of standard_attention on Q, K, V of shape (n, d)."""
    t_r = len(blocks(n, block_q))
    s_and_p = 2 * n * n  # read once each (kernels 2 and 3), written once each (kernels 1 and 2)
    q_k_v = n * d + 2 * t_r * n * d  # Q once; K (kernel 1) and V (kernel 3) per query block
    return s_and_p + q_k_v, s_and_p + n * d


def flash_attention(hbm: HBM, block_q: int, block_k: int, causal: bool = False,
                    scale: float | None = None) -> None:
    """FlashAttention-2's Algorithm 1 (query blocks outside) on hbm's Q, K, V (n, d): per query
    block, walk its key tiles keeping m, l and acc on chip, then write its rows of O (n, d) and
    L (n,) once."""
    n, d = hbm.shape("Q")
    scale = 1 / np.sqrt(d) if scale is None else scale
    for rows in blocks(n, block_q)[::-1]:
        with hbm.on_chip():
            q = scale * hbm.read("Q", rows)
            m = np.full(len(q), -np.inf)
            l = np.zeros(len(q))
            acc = np.zeros_like(q)
            visible = min(n, -(-rows.stop // block_k) * block_k) if causal else n  # whole tiles
            for keys in blocks(visible, block_k)[::-1]:  # the diagonal tile first: online softmax takes any order
                with hbm.on_chip():
                    s = q @ hbm.read("K", keys).T
                    if causal and keys.stop > rows.start + 1:  # only tiles the diagonal crosses need the mask
                        s = np.where(causal_mask(rows, keys), s, -np.inf)
                    m_new = np.maximum(m, s.max(axis=1))
                    # The diagonal tile may hold no key for a block's first rows: shift by 0 while m is -inf.
                    shift = np.where(np.isneginf(m_new), 0, m_new)
                    p = np.exp(s - shift[:, None])
                    alpha = np.exp(m - shift)
                    l = alpha * l + p.sum(axis=1)
                    acc = alpha[:, None] * acc + p @ hbm.read("V", keys)
                    m = m_new
            hbm.write("O", rows, value=acc / l[:, None])
            hbm.write("L", rows, value=m + np.log(l))


def flash_attention_io(n: int, d: int, block_q: int, block_k: int,
                       causal: bool = False) -> tuple[int, int]:
    """(reads, writes) in elements of flash_attention on Q, K, V of shape (n, d)."""
    q_blocks = blocks(n, block_q)
    if causal:  # each query block reads its tiles whole, up to the one holding its last query
        keys = sum(min(n, -(-rows.stop // block_k) * block_k) for rows in q_blocks)
    else:
        keys = len(q_blocks) * n
    return n * d + 2 * d * keys, n * d + n
