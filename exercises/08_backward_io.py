"""Exercise 08 — what recomputation saves: the backward pass's HBM traffic.

The idea
    The forward pass of standard attention leaves P (n x n) in HBM, and its backward reads it
    back, writes dP and dS (n x n each) and reads them again: seven n² element moves against a
    few nd. FlashAttention kept only O and the n log-sum-exps L: its backward rebuilds each tile
    of P on chip from Q, K and L (P = exp(scale·QKᵀ - L)) and never moves an n x n array. It pays
    by reading Q, dO, L, D and dQ once per key block, and writing dQ back each time.

Standard attention backward: the paper's Algorithm 3, five kernels (T_r = ceil(n / block_q)
query blocks, T_c = ceil(n / block_k) key blocks)
    1  dV = PᵀdO     per key block: its P tile and dO rows per query block   P n², dO T_c·nd
    2  dP = dO Vᵀ    per query block: dO once, V per key block, write dP      dO nd, V T_r·nd
    3  dS = P ∘ (dP - rowsum(P ∘ dP))  a query block of full rows of P, dP    P n², dP n²
    4  dQ = scale·dS K   per query block: dS tiles and K rows                 dS n², K T_r·nd
    5  dK = scale·dSᵀQ   per key block: dS tiles and Q rows                   dS n², Q T_c·nd
    It writes dV, dQ, dK (nd each), dP and dS (n² each). P already holds 0 where the mask
    forbids a pair, so dS does too: the mask changes no count, and no kernel needs it.

FlashAttention backward, in the order of FlashAttention-2
    First D = rowsum(dO ∘ O): read dO and O, write D (n). Then for each key block j, read K_j and
    V_j once and keep dK_j = dV_j = 0 on chip; for each query block i scheduled with j, read Q_i,
    dO_i, L_i, D_i and dQ_i, recompute P_ij = exp(scale·Q_i K_jᵀ - L_i) (0 where masked),
        dV_j += P_ijᵀ dO_i     dP_ij = dO_i V_jᵀ     dS_ij = P_ij ∘ (dP_ij - D_i)
        dQ_i += scale·dS_ij K_j  (written back to HBM)   dK_j += scale·dS_ijᵀ Q_i
    and after the last query block write dK_j and dV_j. dQ starts at 0 in HBM.

The counts, in elements
    standard  reads 5n² + nd + 2·T_r·nd + 2·T_c·nd        writes 2n² + 3nd  (causal or not)
    flash     reads 4nd + T_c·(3nd + 2n)                  writes n + T_c·nd + 2nd
    Causal flash skips the tiles above the diagonal: T_c·n becomes R = Σ_j rows_j, the query
    rows of the tiles scheduled for key block j (a tile is read whole): reads 4nd + (3d + 2)·R,
    writes n + d·R + 2nd.

Dropout: what fusing saves beside recomputation
    Standard attention runs dropout as a kernel of its own each way. The forward's reads P and
    writes the dropped P and the keep mask; O = P V (exercise 05) and kernel 1 here read the
    dropped P where they read P. The backward's reads kernel 2's dO Vᵀ, the gradient of the
    dropped P, and the mask, and writes dP = (dO Vᵀ) ∘ mask/(1 - p) for kernel 3. Each moves three
    n x n arrays: dropout adds reads n², writes 2n² to the forward and reads 2n², writes n² to the
    backward, causal or not, 6n² in all. The mask counts as n² elements, as the simulator counts any array (PyTorch
    stores it as one byte an entry, half of an fp16 P). FlashAttention adds nothing: it draws a
    tile's mask on chip from a seed where it computes P, and the backward draws it again
    (exercise 14). The grader's table shows both with dropout beside the paper's Figure 2.

Blocks and SRAM
    FlashAttention's backward moves about 4n²d/block_k + 2n²/block_k elements: halve block_k,
    double the traffic. A key block keeps K_j, V_j, dK_j and dV_j on chip (4·block_k·d) beside a
    query block's Q_i, dO_i, dQ_i, L_i, D_i, so an SRAM of M elements allows block_k = Θ(M/d):
    Θ(n²d²/M) moves (the paper's Theorem 5), far below n² when d² is far below M. Standard
    attention's 7n² moves do not shrink with any block size: its blocks only change the
    2·(T_r + T_c)·nd re-reads of K, V, Q and dO.

In the paper
    FlashAttention (Dao et al., 2022), Appendix B: Algorithm 3 is the standard backward above,
    line by line; Algorithm 4 is FlashAttention's, with key blocks outside and query blocks
    inside as here (it recomputes D_i per tile from O_i; here, as in FlashAttention-2, D is
    computed once first). Theorem 5 gives Θ(nd + n²) against Θ(n²d²M⁻¹).

The simulator (kata.given.hbm.HBM) holds Q, K, V, O, dO (n, d) and L (n,) from the forward, P (n, n)
for the standard algorithm only, and outputs dQ, dK, dV (n, d), dP and dS (n, n) for standard,
D (n,) for flash. Read inside `with hbm.on_chip():`; what is live may not exceed hbm.capacity,
so hold one key block and one query block's tiles at a time (kernel 3: one block of full rows).
As in exercise 05, blocks(n, size) and causal_mask(rows, keys) come from kata/given/hbm.py.

Conventions
    scale defaults to 1/sqrt(d); causal: query i attends key j iff j <= i, so no row is fully
    masked. Blocks are cut at the array's end. Nothing is moved that the counts do not list.

Worked example
    n = 4, d = 2, block_q = block_k = 2: T_r = T_c = 2. Standard reads 5·16 + 8 + 32 + 32 = 152,
    writes 32 + 24 = 56. Flash reads 32 + 2·(24 + 8) = 96, writes 4 + 16 + 16 = 36. Causal flash:
    key block 0 pairs with both query blocks, key block 1 with the second only: R = 4 + 2 = 6,
    reads 32 + 8·6 = 80, writes 4 + 12 + 16 = 32. Non-causal, standard moves 208 - 132 = 76 more:
    7n² - 2nd + 2·(T_r - T_c)·nd - (2·T_c + 1)·n in general.
"""
import numpy as np

from kata.given.hbm import HBM


def standard_attention_backward(hbm: HBM, block_q: int, block_k: int, causal: bool = False,
                                scale: float | None = None) -> None:
    """Algorithm 3, five kernels on hbm's Q, K, V, dO (n, d) and P (n, n), masked pairs 0:
    write dV, dP, dS, dQ, dK. `causal` changes nothing: P already holds the mask."""
    n, d = hbm.shape("Q")
    scale = 1 / np.sqrt(d) if scale is None else scale
    # TODO: the five kernels in the lesson's order, each reading what its line says. Keep a
    #       kernel's running sum (dV_j, dQ_i or dK_j) on chip and write it once.
    raise NotImplementedError("standard_attention_backward: replace this line with your code")


def standard_backward_io(n: int, d: int, block_q: int, block_k: int,
                         causal: bool = False) -> tuple[int, int]:
    """(reads, writes) in elements of standard_attention_backward on Q, K, V, dO of shape (n, d)."""
    # TODO: add up what each of the five kernels reads and writes. The mask changes no count.
    raise NotImplementedError("standard_backward_io: replace this line with your code")


def flash_attention_backward(hbm: HBM, block_q: int, block_k: int, causal: bool = False,
                             scale: float | None = None) -> None:
    """FlashAttention's backward on hbm's Q, K, V, O, dO (n, d) and L (n,): write D (n,), then
    dK, dV (n, d) once per key block, adding into dQ (n, d, zero at the start) per tile."""
    n, d = hbm.shape("Q")
    scale = 1 / np.sqrt(d) if scale is None else scale
    # TODO: write D = rowsum(dO ∘ O) a block at a time. Then per key block read K and V once;
    #       per scheduled query block read Q, dO, L, D and dQ, rebuild P from L, add into dV, dK
    #       and dQ, and write dQ back; after the last query block write dK and dV.
    raise NotImplementedError("flash_attention_backward: replace this line with your code")


def flash_backward_io(n: int, d: int, block_q: int, block_k: int,
                      causal: bool = False) -> tuple[int, int]:
    """(reads, writes) in elements of flash_attention_backward on Q, K, V, O, dO of shape (n, d)."""
    # TODO: D's pass; K and V once; per scheduled tile the query block's Q, dO, dQ (d each per
    #       row) and L, D (1 each per row), and its dQ written back; dK and dV once.
    raise NotImplementedError("flash_backward_io: replace this line with your code")
