"""Alternative: a generator yields each held shard while the next one travels; the loop only attends and merges."""
import math

import torch
import torch.distributed as dist


def travelling_shards(k, v, world, send_to, recv_from, group):
    """(step, k, v) for each step of the ring, the next shard's transfer in flight while the caller computes."""
    k, v = k.contiguous(), v.contiguous()
    for step in range(world):
        requests = []
        if step < world - 1:
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            requests = [dist.isend(k, send_to, group), dist.isend(v, send_to, group),
                        dist.irecv(k_next, recv_from, group), dist.irecv(v_next, recv_from, group)]
        yield step, k, v
        for request in requests:
            request.wait()
        if requests:
            k, v = k_next, v_next


def ring_attention(q, k, v, causal=False, scale=None, group=None):
    rank, world, send_to, recv_from = ring_neighbours(group)
    o = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=torch.promote_types(q.dtype, torch.float32), device=q.device)
    lse = torch.full(q.shape[:-1], -math.inf, dtype=o.dtype, device=q.device)
    for step, k_held, v_held in travelling_shards(k, v, world, send_to, recv_from, group):
        src = (rank - step) % world
        if causal and src > rank:
            continue
        o, lse = merge_partials(o, lse, *local_attention(q, k_held, v_held, causal=causal and src == rank, scale=scale))
    return o.to(q.dtype), lse.to(q.dtype)
