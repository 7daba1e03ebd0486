"""Alternative: standard's kernels run 2, 3, 5, 4, 1; flash computes D a row at a time and reads dQ first."""
import numpy as np

from kata.given.hbm import HBM, blocks, causal_mask


def standard_attention_backward(hbm: HBM, block_q: int, block_k: int, causal: bool = False,
                                scale: float | None = None) -> None:
    n, d = hbm.shape("Q")
    scale = 1 / np.sqrt(d) if scale is None else scale
    # dP = dO Vᵀ
    for rows in blocks(n, block_q):
        with hbm.on_chip():
            do = hbm.read("dO", rows)
            for keys in blocks(n, block_k):
                with hbm.on_chip():
                    v = hbm.read("V", keys)
                    hbm.write("dP", rows, keys, np.einsum("id,jd->ij", do, v))
    # dS from full rows; D here is rowsum(P ∘ dP)
    for rows in blocks(n, block_q):
        with hbm.on_chip():
            dp = hbm.read("dP", rows, slice(None))
            p = hbm.read("P", rows, slice(None))
            delta = np.einsum("ij,ij->i", p, dp)
            hbm.write("dS", rows, slice(None), p * dp - p * delta[:, None])
    # dK = scale · dSᵀ Q, then dQ = scale · dS K, then dV = Pᵀ dO
    for keys in blocks(n, block_k):
        dk = 0.0
        for rows in blocks(n, block_q):
            with hbm.on_chip():
                q = hbm.read("Q", rows)
                dk = dk + np.einsum("ij,id->jd", hbm.read("dS", rows, keys), q)
        hbm.write("dK", keys, value=scale * dk)
    for rows in blocks(n, block_q):
        dq = 0.0
        for keys in blocks(n, block_k):
            with hbm.on_chip():
                k = hbm.read("K", keys)
                dq = dq + hbm.read("dS", rows, keys) @ (scale * k)
        hbm.write("dQ", rows, value=dq)
    for keys in blocks(n, block_k):
        dv = 0.0
        for rows in blocks(n, block_q):
            with hbm.on_chip():
                do = hbm.read("dO", rows)
                dv = dv + np.einsum("ij,id->jd", hbm.read("P", rows, keys), do)
        hbm.write("dV", keys, value=dv)


def standard_backward_io(n: int, d: int, block_q: int, block_k: int,
                         causal: bool = False) -> tuple[int, int]:
    t_r, t_c = len(blocks(n, block_q)), len(blocks(n, block_k))
    matrices = 5 * n * n, 2 * n * n  # reads: P twice, dP, dS twice; writes: dP, dS
    rows_of_nd = 1 + 2 * t_r + 2 * t_c, 3  # reads: dO; K, V per query block; Q, dO per key block
    return matrices[0] + rows_of_nd[0] * n * d, matrices[1] + rows_of_nd[1] * n * d


def flash_attention_backward(hbm: HBM, block_q: int, block_k: int, causal: bool = False,
                             scale: float | None = None) -> None:
    n, d = hbm.shape("Q")
    scale = 1 / np.sqrt(d) if scale is None else scale
    for row in range(n):
        with hbm.on_chip():
            o, do = hbm.read("O", slice(row, row + 1)), hbm.read("dO", slice(row, row + 1))
            hbm.write("D", slice(row, row + 1), value=np.sum(o * do, axis=1))
    for keys in blocks(n, block_k):
        dk = dv = 0.0
        with hbm.on_chip():
            v = hbm.read("V", keys)
            k = hbm.read("K", keys)
            first = keys.start // block_q if causal else 0  # the query block holding row keys.start
            for rows in blocks(n, block_q)[first:]:
                with hbm.on_chip():
                    dq = hbm.read("dQ", rows)
                    delta = hbm.read("D", rows)[:, None]
                    lse = hbm.read("L", rows)[:, None]
                    do = hbm.read("dO", rows)
                    q = hbm.read("Q", rows)
                    s = scale * (q @ k.T)
                    p = np.exp(np.where(causal_mask(rows, keys), s, -np.inf) - lse if causal else s - lse)
                    ds = p * (do @ v.T - delta)
                    dv = dv + p.T @ do
                    dk = dk + scale * (ds.T @ q)
                    hbm.write("dQ", rows, value=dq + scale * (ds @ k))
            hbm.write("dV", keys, value=dv)
            hbm.write("dK", keys, value=dk)


def flash_backward_io(n: int, d: int, block_q: int, block_k: int,
                      causal: bool = False) -> tuple[int, int]:
    t_c = len(blocks(n, block_k))
    met = sum(n - keys.start // block_q * block_q for keys in blocks(n, block_k)) if causal else t_c * n
    return 2 * n * d + 2 * n * d + met * (3 * d + 2), n + met * d + 2 * n * d
