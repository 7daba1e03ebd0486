"""Alternative: shards travel the other way round (to rank - 1); the merge as a logsumexp over stacked sides."""
import math

import torch
import torch.distributed as dist


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Given: attention of one query shard over one key shard, with 03's conventions.

    q (B, H, n_q, D), k (B, H, n_k, D), v (B, H, n_k, D_v); causal: top-left within the shards
    (the diagonal step). Returns o (B, H, n_q, D_v) and lse (B, H, n_q); no live key: (0, -inf).
    """
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


def merge_partials(o_a, lse_a, o_b, lse_b):
    both = torch.stack([lse_a, lse_b])
    lse = torch.logsumexp(both, dim=0)
    weights = torch.exp(both - torch.where(torch.isneginf(lse), 0.0, lse))
    sides = torch.stack([o_a, o_b])
    o = torch.where(weights[..., None] > 0, weights[..., None] * sides, 0.0).sum(dim=0)
    return o, lse


def ring_attention(q, k, v, causal=False, scale=None, group=None):
    rank, world, after, before = ring_neighbours(group)
    o = q.new_zeros(*q.shape[:-1], v.shape[-1])
    lse = q.new_full(q.shape[:-1], -math.inf)
    held = (k, v)
    for step in range(world):
        src = (rank + step) % world
        ops = []
        if step + 1 < world:
            incoming = (torch.empty_like(k), torch.empty_like(v))
            ops = dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, t, before, group) for t in held]
                + [dist.P2POp(dist.irecv, t, after, group) for t in incoming])
        if src < rank or not causal:
            o, lse = merge_partials(o, lse, *local_attention(q, *held, causal=False, scale=scale))
        elif src == rank:
            o, lse = merge_partials(o, lse, *local_attention(q, *held, causal=True, scale=scale))
        for op in ops:
            op.wait()
        if ops:
            held = incoming
    return o, lse
