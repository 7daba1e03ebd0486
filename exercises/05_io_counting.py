"""Exercise 05 — count every element moved between HBM and SRAM.

The idea
    A GPU computes in a small fast memory on chip (SRAM: on an A100, 192 KB in each of its 108
    multiprocessors, about 19 TB/s over all of them) and keeps its arrays in a large slow one
    (HBM: 40-80 GB, 1.5-2 TB/s). Standard attention writes the n x n scores S to HBM, reads them
    back to write P = softmax(S), and reads P back to form O = PV: 4n² element moves, against a
    few nd for Q, K, V and O. For n >> d it spends its time moving S and P: it is memory-bound.
    FlashAttention never moves S or P: it keeps each tile of them on chip. In FlashAttention-2's
    loop order, used here, it moves only Q, K, V, O and the n log-sum-exps L, and pays for it by
    reading K and V once per query block (the original FlashAttention puts key blocks outside
    and re-reads Q, O, l and m once per key block instead).

The counts, in elements (T_r = ceil(n / block_q) query blocks)
    standard  reads 2n² + nd + 2·T_r·nd    writes 2n² + nd        (causal or not)
    flash     reads nd + 2·T_r·nd          writes nd + n          (non-causal)
    Causal flash skips the tiles above the diagonal: it reads nd + 2d·Σ_i keys_i, where keys_i
    counts the key rows of the tiles scheduled for query block i (a tile is read whole).

The block sizes (block_sizes)
    An SRAM of M elements sets how large the blocks can be, and only the outer block's size sets
    the re-reads (T_r = ceil(n / block_q)). The paper's rule, with its loops swapped (its outer
    blocks are keys, ours are queries):
        block_q = ⌈M/4d⌉                                   the paper's B_c
        block_k = min(⌈M/4d⌉, d, ⌊(M - d·block_q) / 2d⌋)   its B_r, cut so that the walk fits
    ⌈M/4d⌉: four blocks of that many rows of d share the SRAM (the paper's Q_i, O_i, K_j, V_j).
    The cap at d keeps the block_q x block_k score tile within about M/4. The cut: the simulator
    counts only what is read, so the walk holds d·(block_q + 2·block_k) elements at once (a Q
    block, one K and one V tile), and the ceiling alone can pass M (at M = 5d, blocks (2, 2) hold
    6d). Writing O while Q is live needs 2d·block_q, which ⌈M/4d⌉ keeps within M. M < 3d holds
    not even one row each of Q, K and V: ValueError (and for d < 1). A real kernel must also fit
    m, l, acc and the score tile, which the simulator does not count; the paper's four blocks
    leave room.

In the paper
    Theorem 2 (section 3.2), for an SRAM of M elements with d <= M <= Nd: standard attention
    makes Θ(Nd + N²) HBM accesses, FlashAttention Θ(N²d²M⁻¹). The paper's Algorithm 1 puts key
    blocks in the outer loop and re-reads Q and O for each; here, as in FlashAttention-2 (Dao,
    2023, arXiv 2307.08691), query blocks are outside and K and V are re-read. Either way a
    block holds Θ(M/d) rows (Algorithm 1, line 1), so the re-read term 2·T_r·Nd = 2N²d/block_q
    is Θ(N²d²/M): far below N² when d² is far below M. The tests measure it: with
    block_sizes(M, d), doubling M halves the K and V traffic until one query block holds the
    whole sequence (M ≈ 4nd), where Q, K, V are read once and O, L written once.
    Proposition 3: no exact attention algorithm makes o(N²d²M⁻¹) HBM accesses for all M in
    [d, Nd]: at M = Θ(Nd) that would be o(Nd), fewer than reading Q, K, V and writing O takes. So
    the count you write here cannot be beaten asymptotically at every M at once; the proof uses
    only the top of the range (Saha & Ye, ICML 2024, prove the bound for each M >= d², and beat
    it below d²).

The simulator (kata.given.hbm.HBM) holds Q, K, V (n, d) and NaN-filled outputs O (n, d), L (n,),
S and P (n, n). hbm.read(name, rows, cols) returns a copy and counts its elements as reads;
hbm.write(name, rows, cols, value) counts writes (cols=None: every column; L takes rows only).
Every read sits inside `with hbm.on_chip():` and stays live on chip until that block ends; what
is live may not exceed hbm.capacity, so hold one query block, and one key tile at a time.
kata/given/hbm.py also gives the loops' pieces: blocks(n, size), the row blocks of n rows (the
last one cut at n), and causal_mask(rows, keys), True where a pair of the tile may attend.
Import them where you use them: from kata.given.hbm import blocks, causal_mask.

Conventions
    scale defaults to 1/sqrt(d); causal: query i attends key j iff j <= i. Blocks are cut at
    the array's end, so the last one may be shorter. Nothing is moved that the counts do not list.

Worked example
    n = 4, d = 2, block_q = block_k = 2, so T_r = 2. Standard: reads 32 + 8 + 32 = 72, writes
    32 + 8 = 40. Flash: reads 8 + 32 = 40, writes 8 + 4 = 12. Standard moves 112 - 52 = 60
    elements more: 4n² - n, the S and P traffic less the n values of L.
    block_sizes at d = 4: M = 12 gives (1, 1); M = 20 gives (2, 1), where (2, 2) would hold 24;
    M = 64 gives (4, 4); M = 256 gives (16, 4).
"""
import numpy as np

from kata.given.hbm import HBM


def standard_attention(hbm: HBM, block_q: int, block_k: int, causal: bool = False,
                       scale: float | None = None) -> None:
    """Algorithm 0, three kernels on hbm's Q, K, V (n, d): S = scale·QKᵀ, P = softmax(S), both
    (n, n), then O = PV (n, d), each written to hbm."""
    n, d = hbm.shape("Q")
    scale = 1 / np.sqrt(d) if scale is None else scale
    # TODO: kernel 1 writes S tile by tile, kernel 2 turns a block of full rows of S into P
    #       (masking here), kernel 3 sums P tiles times V rows into O.
    raise NotImplementedError("standard_attention: replace this line with your code")


def standard_attention_io(n: int, d: int, block_q: int, block_k: int,
                          causal: bool = False) -> tuple[int, int]:
    """(reads, writes) in elements of standard_attention on Q, K, V of shape (n, d)."""
    # TODO: add up what each kernel reads and writes. The mask changes no count.
    raise NotImplementedError("standard_attention_io: replace this line with your code")


def flash_attention(hbm: HBM, block_q: int, block_k: int, causal: bool = False,
                    scale: float | None = None) -> None:
    """FlashAttention-2's Algorithm 1 (query blocks outside) on hbm's Q, K, V (n, d): per query
    block, walk its key tiles keeping m, l and acc on chip, then write its rows of O (n, d) and
    L (n,) once."""
    n, d = hbm.shape("Q")
    scale = 1 / np.sqrt(d) if scale is None else scale
    # TODO: for each query block read Q once; for each scheduled key tile read K and V and update
    #       m, l, acc; then write O and L (lse = m + log l) once.
    raise NotImplementedError("flash_attention: replace this line with your code")


def flash_attention_io(n: int, d: int, block_q: int, block_k: int,
                       causal: bool = False) -> tuple[int, int]:
    """(reads, writes) in elements of flash_attention on Q, K, V of shape (n, d)."""
    # TODO: Q once; K and V rows of every scheduled tile, per query block; O and L once.
    raise NotImplementedError("flash_attention_io: replace this line with your code")


def block_sizes(M: int, d: int) -> tuple[int, int]:
    """(block_q, block_k) for an SRAM of M elements and head dimension d: the paper's Algorithm 1,
    line 1, with query blocks outside, block_k cut so that flash_attention's walk fits in M."""
    # TODO: block_q = ceil(M / 4d); block_k = min(ceil(M / 4d), d, floor((M - d·block_q) / 2d));
    #       a ValueError naming M and d when M < 3d or d < 1.
    raise NotImplementedError("block_sizes: replace this line with your code")
