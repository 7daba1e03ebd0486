"""Alternative: the closed forms counted tile by tile in Python loops, as the kernels move them."""
import numpy as np

from kata.given.hbm import HBM, blocks


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
    reads = writes = 0
    for keys in blocks(n, block_k):  # kernels 1 and 5: P or dS tiles with dO or Q rows
        for rows in blocks(n, block_q):
            reads += 2 * (size(rows) * size(keys) + size(rows) * d)
        writes += 2 * size(keys) * d  # dV, dK
    for rows in blocks(n, block_q):
        reads += size(rows) * d  # kernel 2: dO once
        for keys in blocks(n, block_k):
            reads += 2 * size(keys) * d  # kernel 2: V; kernel 4: K
            reads += size(rows) * size(keys)  # kernel 4: dS
            writes += size(rows) * size(keys)  # kernel 2: dP
        reads += 2 * size(rows) * n  # kernel 3: full rows of P and dP
        writes += size(rows) * n + size(rows) * d  # kernel 3: dS; kernel 4: dQ
    return reads, writes


def flash_backward_io(n: int, d: int, block_q: int, block_k: int,
                      causal: bool = False) -> tuple[int, int]:
    reads, writes = 2 * n * d, n  # D's pass
    for keys in blocks(n, block_k):
        reads += 2 * size(keys) * d  # K, V
        for rows in blocks(n, block_q):
            if causal and rows.stop <= keys.start:
                continue
            reads += size(rows) * (3 * d + 2)  # Q, dO, dQ; L, D
            writes += size(rows) * d  # dQ
        writes += 2 * size(keys) * d  # dK, dV
    return reads, writes
