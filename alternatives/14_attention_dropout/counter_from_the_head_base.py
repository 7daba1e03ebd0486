"""Alternative: the counter as the head's first counter, bh·n_q·n_k, plus the pair's place in the head,
q_idx·n_k + kv_idx (both in int64), and the keep test written as a drop test."""
import triton
import triton.language as tl


@triton.jit
def keep_mask(seed, dropout_p, bh, q_idx, kv_idx, n_q, n_k):
    """True where dropout keeps pair (q_idx, kv_idx) of batch·head bh."""
    head_base = bh.to(tl.int64) * n_q * n_k
    counter = head_base + q_idx.to(tl.int64) * n_k + kv_idx
    dropped = tl.rand(seed, counter) < dropout_p
    return dropped == 0
