"""Alternative: integer closed forms; causal keys summed per key block, T_r - floor(j·block_k / block_q) times each.

P computed as exp(S - lse) in kernel 2; O accumulated in a preallocated array."""
import numpy as np

from kata.given.hbm import HBM, blocks, causal_mask


def standard_attention(hbm: HBM, block_q: int, block_k: int, causal: bool = False,
                       scale: float | None = None) -> None:
    """Algorithm 0, three kernels on hbm's Q, K, V (n, d): S = scale·QKᵀ, P = softmax(S), both
    (n, n), then O = PV (n, d), each written to hbm."""
    n, d = hbm.shape("Q")
    scale = 1 / np.sqrt(d) if scale is None else scale
    q_blocks, k_blocks = blocks(n, block_q), blocks(n, block_k)
    for rows in q_blocks:
        with hbm.on_chip():
            q = hbm.read("Q", rows)
            for keys in k_blocks:
                with hbm.on_chip():
                    hbm.write("S", rows, keys, scale * (q @ hbm.read("K", keys).T))
    for rows in q_blocks:
        with hbm.on_chip():
            s = hbm.read("S", rows, slice(None))
            if causal:
                s = np.where(causal_mask(rows, slice(0, n)), s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            lse = m + np.log(np.exp(s - m).sum(axis=1, keepdims=True))
            hbm.write("P", rows, slice(None), np.exp(s - lse))
    for rows in q_blocks:
        o = np.zeros((rows.stop - rows.start, d))
        for keys in k_blocks:
            with hbm.on_chip():
                o += hbm.read("P", rows, keys) @ hbm.read("V", keys)
        hbm.write("O", rows, value=o)


def standard_attention_io(n: int, d: int, block_q: int, block_k: int,
                          causal: bool = False) -> tuple[int, int]:
    """(reads, writes) in elements of standard_attention on Q, K, V of shape (n, d)."""
    t_r = (n + block_q - 1) // block_q
    return 2 * n * n + n * d * (1 + 2 * t_r), n * (2 * n + d)


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
            key_blocks = blocks(n, block_k)
            if causal:  # only the tiles that start at or before the block's last query
                key_blocks = [keys for keys in key_blocks if keys.start < rows.stop]
            for keys in key_blocks:
                with hbm.on_chip():
                    k, v = hbm.read("K", keys), hbm.read("V", keys)
                    s = scale * (q @ k.T)
                    if causal:
                        s[~causal_mask(rows, keys)] = -np.inf
                    m_new = np.maximum(m, s.max(axis=1))
                    p = np.exp(s - m_new[:, None])
                    alpha = np.exp(m - m_new)
                    l, acc, m = alpha * l + p.sum(axis=1), alpha[:, None] * acc + p @ v, m_new
            lse = m + np.log(l)
            hbm.write("L", rows, value=lse)
            hbm.write("O", rows, value=acc / l[:, None])


def flash_attention_io(n: int, d: int, block_q: int, block_k: int,
                       causal: bool = False) -> tuple[int, int]:
    """(reads, writes) in elements of flash_attention on Q, K, V of shape (n, d)."""
    t_r = (n + block_q - 1) // block_q
    if not causal:
        return n * d * (1 + 2 * t_r), n * (d + 1)
    # Key block j (rows j·block_k .. ) is read by query block i iff it starts before the block ends,
    # (i + 1)·block_q > j·block_k: that is every i from floor(j·block_k / block_q) to T_r - 1.
    t_c = (n + block_k - 1) // block_k
    keys = sum(min(block_k, n - j * block_k) * (t_r - j * block_k // block_q) for j in range(t_c))
    return n * d + 2 * d * keys, n * (d + 1)
