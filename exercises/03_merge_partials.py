"""Exercise 03 — two partial results make one exact result.

The idea
    Split the keys of attention into two disjoint sets A and B and attend each on its own: each
    side gives a normalised output o and the log-sum-exp lse of its scores. The two outputs are
    weighted averages of values, each normalised by its own sum of exp. The lse says how much
    weight each side carries in the union: the union's lse is logaddexp(lse_a, lse_b), and side A
    holds the fraction exp(lse_a - lse) of the union's total. So the exact result is a weighted
    sum, with no need to see any score again. This is how split-KV (Flash-Decoding) kernels work.

The formulas (one query row)
    s_j = scale * q . k_j                          scale defaults to 1/sqrt(d)
    lse = log sum_j exp(s_j),   o = sum_j exp(s_j - lse) v_j
    merge:  lse = logaddexp(lse_a, lse_b)
            o   = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b

In the paper
    FlashAttention (Dao et al., 2022), Algorithm 1, line 12, is this merge with the running
    (m, l) in place of lse: O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~ - m_new) P~ V_j).
    FlashAttention-2 (Dao, 2023, arXiv 2307.08691) writes only L_i = m_i + log(l_i), the lse,
    to HBM, for its backward pass. Merging whole partial results by their lse, as here, is how
    Flash-Decoding (Dao, Haziza, Massa, Sizov, 2023) merges the splits of a long KV cache. Rabe &
    Staats (2021, arXiv 2112.05682) combine chunks of keys in the equivalent unnormalised form:
    each chunk keeps its exp-weighted sum of values, its sum of exps and its max; the chunks are
    rescaled to the largest max, added, and divided once (FlashAttention's appendix B.5: each
    block's temporary output and softmax statistics, combined at the end).

Conventions
    - A boolean mask is True where a query may attend a key; False scores become -inf.
    - A side that attended no key (no keys at all, or every key masked) is (o = 0, lse = -inf).
      It weighs nothing: (anything, -inf) is the identity of the merge, whatever its o holds,
      and two -inf sides give (0, -inf). Never NaN: -inf - (-inf) is NaN, and so is 0 * NaN.
    - float32 in gives float32 out, float64 in gives float64 out; inputs are never modified.

Worked example (one query, scores s = [0, log 3] over values [[1], [5]])
    side A = key 0: o_a = [1], lse_a = 0;   side B = key 1: o_b = [5], lse_b = log 3
    lse = logaddexp(0, log 3) = log 4;  o = (1/4)[1] + (3/4)[5] = [4]
"""
import numpy as np


def attention_partial(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None,
                      scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Attention of `q (n_q, d)` over `k (n_k, d)`, `v (n_k, d_v)`; `mask (n_q, n_k)` bool or None.

    Returns `o (n_q, d_v)`, normalised, and `lse (n_q,)`. With n_k = 0: o = 0, lse = -inf.
    """
    # TODO: scores, mask, a safe softmax with its lse, then the weighted sum of values.
    raise NotImplementedError("attention_partial: replace this line with your code")


def merge_partials(o_a: np.ndarray, lse_a: np.ndarray, o_b: np.ndarray,
                   lse_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge attention over two disjoint key sets: `o_a, o_b (n_q, d_v)`, `lse_a, lse_b (n_q,)`.

    Returns `(o, lse)` over the union of the key sets, shapes of `o_a` and `lse_a`.
    """
    # TODO: lse of the union, then each side weighted by its share of it.
    #       A side with lse = -inf must contribute exactly nothing, even if its o is NaN.
    raise NotImplementedError("merge_partials: replace this line with your code")


def split_kv_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, num_splits: int,
                       mask: np.ndarray | None = None,
                       scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Attention of `q (n_q, d)` over `k (n_k, d)`, `v (n_k, d_v)`, the keys cut in `num_splits` chunks.

    The chunks are contiguous and in order, none longer than ceil(n_k / num_splits) keys, e.g. in
    the sizes np.array_split gives (empty ones when num_splits > n_k); each is attended with
    attention_partial and merged with merge_partials.
    Returns `o (n_q, d_v)` and `lse (n_q,)`, equal to attention over all keys at once.
    """
    # TODO: start from the merge's identity, then fold in one chunk of keys at a time.
    raise NotImplementedError("split_kv_attention: replace this line with your code")
