"""Exercise 07 — the backward pass, recomputed tile by tile.

The idea
    Training needs dQ, dK, dV from dO, the gradient of the loss with respect to the output. Standard
    attention keeps P (n_q × n_k) from the forward for this: n² numbers per head stored, written to
    HBM and read back (at n = 8192, 64 Mi numbers, 128 MiB in fp16, per head). The forward of
    exercise 04 kept only o and lse, and any tile of P comes back from lse alone:
    P_ij = exp(S_ij − lse_i) with S_ij = scale · Q_i K_jᵀ. Recomputing costs one more matmul per
    tile, FLOPs a GPU has to spare; storing costs n² memory and HBM traffic, which it has not.

The five formulas (S = scale · Q Kᵀ, P = softmax(S) row by row, O = P V)
    dV = Pᵀ dO              O = P V: value j gathers every dO row, weighed by its column of P
    dP = dO Vᵀ              the same product, differentiated in its other factor
    dS = P ∘ (dP − D)       softmax's Jacobian, one row at a time: ∂p_j/∂s_k = p_j (δ_jk − p_k), so
                            ds_k = Σ_j dp_j p_j (δ_jk − p_k) = p_k (dp_k − D), D = Σ_j p_j dp_j
    dQ = scale · dS K       S = scale · Q Kᵀ, differentiated in Q
    dK = scale · dSᵀ Q      and in K

D needs no P
    D_i = Σ_j P_ij dP_ij = Σ_j P_ij (dO_i · v_j) = dO_i · Σ_j P_ij v_j = dO_i · O_i.
    So D = rowsum(dO ∘ O): n_q·d_v products of two arrays at hand. softmax_backward sums p ∘ dp
    along a whole row; a tile holds only part of a row, so the tiled pass needs this form of D.

The loop order (FlashAttention-2)
    D = rowsum(dO ∘ O), once.
    for each key block j:                      read K_j, V_j once; dK_j = dV_j = 0, on chip
        for each query block i the schedule pairs with j:
            S = scale · Q_i K_jᵀ (masked if needs_mask),   P = exp(S − lse_i)
            dV_j += Pᵀ dO_i,   dP = dO_i V_jᵀ,   dS = P ∘ (dP − D_i)
            dQ_i += scale · dS K_j             (dQ_i lives in HBM: read, added to, written back)
            dK_j += scale · dSᵀ Q_i
        write dK_j, dV_j once.
    dK_j and dV_j sum over query blocks, so with key blocks outside they never leave the chip;
    dQ_i sums over key blocks and is added to in HBM (on a GPU: atomics, or exercise 09's split).
    Keeping dK_j and dV_j in locals and writing them once is advice here (NumPy has no chip to
    keep them on; 09 makes it a kernel's registers); the order of key blocks is checked.

In the paper
    FlashAttention (Dao et al., 2022, arXiv 2205.14135), Appendix B.2 shows D_i = do_iᵀ o_i.
    Its backward, Algorithm 4, has this loop order too (key blocks outside), but rebuilds P from
    the max m and the sum ℓ kept apart, P_ij = diag(ℓ_i)⁻¹ exp(S_ij − m_i), and computes
    D_i = rowsum(dO_i ∘ O_i) inside the inner loop, once per tile (line 19). FlashAttention-2
    (Dao, 2023, arXiv 2307.08691), Algorithm 2, keeps only L = m + log(ℓ) (our lse), computes D
    once before the loops and rebuilds P_ij = exp(S_ij − L_i). Here: Algorithm 2, scale included.

Conventions
    - P is 0 where a pair may not attend (exercise 04's tile_schedule and tile_allowed, solved:
      kata/given/solved.py loads them, with block_slice); the mask is applied only on needs_mask tiles.
    - A fully masked row has lse = −inf and only −inf scores: subtract 0 instead (as in exercise
      04), so its P row is 0, its dq row 0, and it adds nothing to dk and dv.
    - float32 in gives float32 out; inputs are never modified; the tiled pass never creates an
      array of n_q × n_k elements.

Worked example (one query, two keys, d = d_v = 1, so scale = 1)
    q = [1], k = [0, ln 3], v = [1, 5], do = [2]: S = [0, ln 3], P = [1/4, 3/4], lse = ln 4, o = 4.
    dV = [1/2, 3/2];  dP = [2, 10];  D = dO·O = 8 = rowsum(P ∘ dP) = 1/2 + 15/2;
    dS = [−3/2, 3/2] (a row of dS sums to 0);  dQ = dS K = (3/2) ln 3;  dK = dSᵀ Q = [−3/2, 3/2].
"""
import numpy as np

from kata.given.solved import solved

# Exercise 04's, solved: the rows of one block, which pairs of a tile may attend, the tiles worth computing.
block_slice, tile_allowed, tile_schedule = (solved("04").block_slice, solved("04").tile_allowed,
                                            solved("04").tile_schedule)


def softmax_backward(p: np.ndarray, dp: np.ndarray) -> np.ndarray:
    """ds = p ∘ (dp − rowsum(p ∘ dp)), rows on the last axis: the gradient through p = softmax(s).

    p and dp have one shape (any number of leading axes); ds has it too, in the dtype of p.
    """
    # TODO: one number per row, D = sum of p ∘ dp along the last axis; then p ∘ (dp − D).
    raise NotImplementedError("softmax_backward: replace this line with your code")


def recompute_weights(s: np.ndarray, lse: np.ndarray) -> np.ndarray:
    """P = exp(s − lse) row by row: the forward's weights, rebuilt from its log-sum-exp.

    s (rows, cols) holds −inf where a pair may not attend; lse (rows,). A fully masked row
    (lse = −inf, every score −inf) gives a row of 0, not NaN.
    """
    # TODO: subtract lse from each row of s, but 0 on rows where lse is -inf; then exp.
    raise NotImplementedError("recompute_weights: replace this line with your code")


def attention_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, lse: np.ndarray,
                       do: np.ndarray, causal: bool = False, mask: np.ndarray | None = None,
                       scale: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The five formulas on whole matrices: your own small oracle for the tiled pass.

    q (n_q, d), k (n_k, d), v (n_k, d_v); o (n_q, d_v) and lse (n_q,) from the forward; do (n_q, d_v);
    mask (n_q, n_k) bool or None; scale defaults to 1/sqrt(d). Returns dq, dk, dv shaped like q, k, v.
    """
    # TODO: S (−inf where tile_allowed over the whole grid is False), P from lse, then
    #       dV, dP, D = rowsum(dO ∘ O), dS, dQ and dK.
    raise NotImplementedError("attention_backward: replace this line with your code")


def tiled_attention_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, lse: np.ndarray,
                             do: np.ndarray, block_q: int, block_k: int, causal: bool = False,
                             mask: np.ndarray | None = None,
                             scale: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same gradients, one scheduled tile at a time, in FlashAttention-2's order.

    Shapes as in attention_backward. For each key block j (ascending), dK_j and dV_j gather the
    tiles of every query block the schedule pairs with j; dq gathers over key blocks. Rows of Q, K,
    V, O and dO in no scheduled tile are never used (they may hold NaN): D = rowsum(dO ∘ O) may
    still be computed for every row at once, as long as no output takes anything from those rows.
    No array of n_q × n_k elements is made.
    """
    # TODO: D = rowsum(dO ∘ O); group tile_schedule's tiles by key block; for each key block keep
    #       dK_j, dV_j, and for each of its tiles rebuild P (mask only if needs_mask) and add in.
    raise NotImplementedError("tiled_attention_backward: replace this line with your code")
