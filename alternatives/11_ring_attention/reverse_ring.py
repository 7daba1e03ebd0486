"""Alternative: shards travel the other way round (to rank - 1); the merge as a logsumexp over stacked sides."""
import math
import torch
import torch.distributed as dist


def merge_partials(o_a, lse_a, o_b, lse_b):
    both = torch.stack([lse_a, lse_b])
    lse = torch.logsumexp(both, dim=0)
    weights = torch.exp(both - torch.where(torch.isneginf(lse), 0.0, lse))
    sides = torch.stack([o_a, o_b])
    o = torch.where(weights[..., None] > 0, weights[..., None] * sides, 0.0).sum(dim=0)
    return o, lse


def ring_attention(q, k, v, causal=False, scale=None, group=None):
    rank, world, after, before = ring_neighbours(group)
    wide = torch.float64 if q.dtype == torch.float64 else torch.float32
    o = q.new_zeros(*q.shape[:-1], v.shape[-1], dtype=wide)
    lse = q.new_full(q.shape[:-1], -math.inf, dtype=wide)
    held = (k.contiguous(), v.contiguous())
    for step in range(world):
        src = (rank + step) % world
        ops = []
        if step + 1 < world:
            incoming = tuple(torch.empty_like(t) for t in held)  # like k, they would take its strides
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
    return o.to(q.dtype), lse.to(q.dtype)
