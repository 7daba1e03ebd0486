"""Exercise 11 — attention across processes: ring attention.

The idea
    Sequence parallelism: a sequence too long for one device is cut into `world` contiguous shards,
    one per rank; rank r holds q, k, v for positions [r·n_local, (r+1)·n_local). Its queries must
    still meet every key. So the K/V shards travel around a ring: at step s rank r holds the shard
    of rank (r - s) mod world, attends it with its own queries (a partial (o, lse)), and passes it
    to rank r + 1 while taking the next from rank r - 1. After world steps every query has met
    every K/V shard once, and exercise 03's merge has made the partials one exact result.

The formula (rank r, step s, shard src = (r - s) mod world)
    (o_s, lse_s) = local_attention(q_r, k_src, v_src)           masked causally iff src == r
    lse = logaddexp(lse, lse_s)     o = exp(lse_old - lse)·o + exp(lse_s - lse)·o_s    (03's merge)

In the paper
    Ring Attention (Liu, Zaharia, Abbeel, 2023, arXiv 2310.01889): blockwise attention across
    devices in a ring, overlapping the transfer of key-value blocks with the blockwise compute.
    Overlap: start the next transfer (isend/irecv, or batch_isend_irecv) BEFORE this step's
    compute and wait for it AFTER, so that the link and the arithmetic work at the same time.
    Volume against compute, per head: each step moves 2·n_local·D numbers (K and V) and computes
    4·n_local²·D FLOPs (QKᵀ and PV), so 2·n_local FLOPs per number moved; over the ring a rank sends
    and receives (world - 1)·2·n_local·D numbers. The transfer hides when 2·n_local exceeds the
    device's FLOP/s over its link's numbers/s: about 1e15 / 2e11 bf16 numbers a second between
    NVLink-connected H100/H200s, so a few thousand tokens per rank.

Causal
    Rank r's queries come after every key of ranks < r and before every key of ranks > r. A step
    whose keys lie wholly after the queries adds nothing: skip its compute (still pass the shard
    on: the next rank needs it). The step with its own shard (src == r) is the diagonal: mask it
    causally. So rank r computes r + 1 steps: rank 0 one, the last rank world, and the ring waits
    for the slowest. A zigzag layout fixes the imbalance (not done here): cut the sequence into
    2·world chunks and give rank r chunks r and 2·world - 1 - r, an early one and a late one, so
    every rank has the same causal work. Striped Attention (Brandon et al., 2023, arXiv 2311.09431)
    deals tokens round-robin instead.

Conventions
    - q, k, v (B, H, n_local, D) torch tensors on every rank, one dtype, any strides (a model's
      (B, n, H, D) projections seen through .transpose(1, 2)); o (B, H, n_local, D) and lse
      (B, H, n_local) in that dtype. scale defaults to 1/sqrt(D). Inputs are never modified.
    - o and lse are carried across the ring in float32 (float64 for float64 inputs), the dtype
      local_attention returns, and cast to the inputs' dtype once at the end: in bfloat16 each
      merge would round again, and the error would grow with the world.
    - gloo sends only contiguous tensors: a strided shard is copied once before it travels.
    - `group` is the ring (None: every process). ring_neighbours(group) (given) says this rank's
      place in it and its neighbours as global ranks, which isend, irecv and P2POp take.
    - A side with no keys is (0, -inf), the identity of the merge; never NaN.

Worked example (world 2, one token per rank, D = 1, scale 1, causal)
    rank 0: q = [[0]], k = [[0]], v = [[1]]      rank 1: q = [[1]], k = [[log 3]], v = [[5]]
    rank 0, step 0: its own key, o = [1], lse = 0; step 1: keys of rank 1 come later, skipped.
    rank 1, step 0: o = [5], lse = log 3; step 1: rank 0's key, o = [1], lse = 0;
    merged (as in 03): lse = log 4, o = 3/4·5 + 1/4·1 = [4]. Each rank sent and received 1 shard.
"""
import math

import torch
import torch.distributed as dist


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Given: attention of one query shard over one key shard, with 03's conventions.

    q (B, H, n_q, D), k (B, H, n_k, D), v (B, H, n_k, D_v); causal: top-left within the shards
    (the diagonal step). Returns o (B, H, n_q, D_v) and lse (B, H, n_q); no live key: (0, -inf).
    Computed and returned in float32, or float64 for float64 inputs: o normalised by a bfloat16
    lse, and merged in bfloat16, would carry a rounding of 2^-8 into every step of the ring.
    """
    q, k, v = (t.to(torch.promote_types(t.dtype, torch.float32)) for t in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * (q @ k.transpose(-1, -2))
    if causal:
        allowed = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    shift = torch.where(torch.isneginf(lse), 0.0, lse)  # a row with no live key: exp(-inf - 0) = 0
    return torch.exp(s - shift[..., None]) @ v, lse


def ring_neighbours(group=None) -> tuple[int, int, int, int]:
    """Given: (rank, world, send_to, recv_from) in the ring `group` (None: every process).

    rank and world count within the ring; send_to (rank + 1) and recv_from (rank - 1) are global
    ranks, as isend, irecv and P2POp take them.
    """
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    ring = group if group is not None else dist.group.WORLD
    return (rank, world, dist.get_global_rank(ring, (rank + 1) % world),
            dist.get_global_rank(ring, (rank - 1) % world))


def merge_partials(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor,
                   lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 03's merge in torch: o (..., n, D_v), lse (..., n) over two disjoint key sets."""
    # TODO: lse of the union, then each side weighted by its share; a side with lse = -inf adds
    #       exactly nothing (its o may be anything, NaN too, and 0 · NaN is NaN: choose with
    #       torch.where rather than multiply), two such sides give (0, -inf).
    # BEGIN SOLUTION
    lse = torch.logaddexp(lse_a, lse_b)
    shift = torch.where(torch.isneginf(lse), 0.0, lse)  # both sides empty: -inf - (-inf) would be NaN
    w_a, w_b = torch.exp(lse_a - shift)[..., None], torch.exp(lse_b - shift)[..., None]
    # A side of weight 0 adds nothing, whatever its o holds: 0 * NaN would be NaN.
    o = torch.where(w_a == 0, 0.0, w_a * o_a) + torch.where(w_b == 0, 0.0, w_b * o_b)
    return o, lse
    # END SOLUTION


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   scale: float | None = None, group=None) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of attention over the whole sequence, its shards of q, k, v (B, H, n_local, D).

    Returns o (B, H, n_local, D_v) and lse (B, H, n_local), equal to one process attending all keys.
    """
    # TODO: ring_neighbours(group) gives your place; start from the merge's identity. Each of the
    #       world steps: unless it is the last, start sending the held K/V shard to send_to and
    #       receiving the next from recv_from; attend the held shard with local_attention unless
    #       causal skips it, and merge; then wait for the transfers and hold what came in. Carry
    #       o and lse in local_attention's dtype, cast once at the end; send contiguous tensors.
    # BEGIN SOLUTION
    rank, world, send_to, recv_from = ring_neighbours(group)
    carried = torch.promote_types(q.dtype, torch.float32)  # what local_attention returns
    o = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=carried, device=q.device)
    lse = torch.full(q.shape[:-1], -math.inf, dtype=carried, device=q.device)
    k_held, v_held = k.contiguous(), v.contiguous()  # a copy only of a strided view, which gloo refuses
    for step in range(world):
        src = (rank - step) % world  # whose shard this rank holds now
        last = step == world - 1  # the shard would go back to its owner: nothing left to pass on
        if not last:  # started before the compute, so the transfer runs while this rank computes
            k_next, v_next = torch.empty_like(k_held), torch.empty_like(v_held)
            transfers = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, k_held, send_to, group), dist.P2POp(dist.isend, v_held, send_to, group),
                dist.P2POp(dist.irecv, k_next, recv_from, group), dist.P2POp(dist.irecv, v_next, recv_from, group),
            ])
        if not causal or src <= rank:  # keys of a later rank come after every query here
            o_step, lse_step = local_attention(q, k_held, v_held, causal=causal and src == rank, scale=scale)
            o, lse = merge_partials(o, lse, o_step, lse_step)
        if not last:
            for transfer in transfers:
                transfer.wait()
            k_held, v_held = k_next, v_next
    return o.to(q.dtype), lse.to(q.dtype)
    # END SOLUTION
