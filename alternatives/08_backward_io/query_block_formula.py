"""Alternative: each closed form one expression, the causal rows summed per query block; P by exp2."""
import math

import numpy as np

from kata.given.hbm import HBM, blocks, causal_mask

LOG2_E = 1 / math.log(2)


def size(block: slice) -> int:
    return block.stop - block.start


def standard_attention_backward(hbm: HBM, block_q: int, block_k: int, causal: bool = False,
                                scale: float | None = None) -> None:
    n, d = hbm.shape("Q")
    scale = 1 / np.sqrt(d) if scale is None else scale
    everything = slice(0, n)
    for keys in blocks(n, block_k):
        dv = np.zeros((size(keys), d))
        for rows in blocks(n, block_q):
            with hbm.on_chip():
                dv += hbm.read("P", rows, keys).T @ hbm.read("dO", rows)
        hbm.write("dV", keys, value=dv)
    for rows in blocks(n, block_q):
        with hbm.on_chip():
            do = hbm.read("dO", rows)
            for keys in blocks(n, block_k):
                with hbm.on_chip():
                    hbm.write("dP", rows, keys, do @ hbm.read("V", keys).T)
    for rows in blocks(n, block_q):
        with hbm.on_chip():
            p, dp = hbm.read("P", rows, everything), hbm.read("dP", rows, everything)
            hbm.write("dS", rows, everything, p * (dp - (p * dp).sum(axis=1, keepdims=True)))
    for rows in blocks(n, block_q):
        dq = np.zeros((size(rows), d))
        for keys in blocks(n, block_k):
            with hbm.on_chip():
                dq += hbm.read("dS", rows, keys) @ hbm.read("K", keys)
        hbm.write("dQ", rows, value=scale * dq)
    for keys in blocks(n, block_k):
        dk = np.zeros((size(keys), d))
        for rows in blocks(n, block_q):
            with hbm.on_chip():
                dk += hbm.read("dS", rows, keys).T @ hbm.read("Q", rows)
        hbm.write("dK", keys, value=scale * dk)


def standard_backward_io(n: int, d: int, block_q: int, block_k: int,
                         causal: bool = False) -> tuple[int, int]:
    blocks_q, blocks_k = (n + block_q - 1) // block_q, (n + block_k - 1) // block_k
    return 5 * n * n + n * d * (1 + 2 * blocks_q + 2 * blocks_k), 2 * n * n + 3 * n * d


def flash_attention_backward(hbm: HBM, block_q: int, block_k: int, causal: bool = False,
                             scale: float | None = None) -> None:
    n, d = hbm.shape("Q")
    scale = 1 / np.sqrt(d) if scale is None else scale
    for rows in blocks(n, block_q):
        with hbm.on_chip():
            hbm.write("D", rows, value=(hbm.read("dO", rows) * hbm.read("O", rows)).sum(axis=1))
    for keys in blocks(n, block_k):
        with hbm.on_chip():
            k, v = hbm.read("K", keys), hbm.read("V", keys)
            dk, dv = np.zeros_like(k), np.zeros_like(v)
            for rows in blocks(n, block_q):
                if causal and rows.stop <= keys.start:
                    continue
                with hbm.on_chip():
                    q, do = hbm.read("Q", rows), hbm.read("dO", rows)
                    lse, delta = hbm.read("L", rows), hbm.read("D", rows)
                    s = (scale * q) @ k.T
                    if causal:
                        s = np.where(causal_mask(rows, keys), s, -np.inf)
                    p = np.exp2((s - lse[:, None]) * LOG2_E)
                    dv += p.T @ do
                    ds = p * (do @ v.T - delta[:, None])
                    hbm.write("dQ", rows, value=hbm.read("dQ", rows) + scale * ds @ k)
                    dk += scale * ds.T @ q
            hbm.write("dK", keys, value=dk)
            hbm.write("dV", keys, value=dv)


def flash_backward_io(n: int, d: int, block_q: int, block_k: int,
                      causal: bool = False) -> tuple[int, int]:
    blocks_k = -(-n // block_k)  # ceil in integers: n / block_k is a float, and rounds once n passes 2^53
    # Query block i meets the key blocks starting before its end: ceil(stop / block_k) of them.
    met = sum(size(rows) * (min(-(-rows.stop // block_k), blocks_k) if causal else blocks_k)
              for rows in blocks(n, block_q))
    return 4 * n * d + (3 * d + 2) * met, n + d * met + 2 * n * d
