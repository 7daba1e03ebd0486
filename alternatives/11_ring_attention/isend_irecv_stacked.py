"""Alternative: one stacked K/V tensor per step through isend/irecv; the merge with an explicit max shift."""
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
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isneginf(m), 0.0, m)
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)
    l = w_a + w_b
    lse = m + torch.log(l)
    safe = torch.where(l == 0, 1.0, l)
    o = (torch.where(w_a[..., None] == 0, 0.0, w_a[..., None] * o_a)
         + torch.where(w_b[..., None] == 0, 0.0, w_b[..., None] * o_b)) / safe[..., None]
    return o, lse


def ring_attention(q, k, v, causal=False, scale=None, group=None):
    rank, world, send_to, recv_from = ring_neighbours(group)
    o, lse = None, None
    kv = torch.stack([k, v])
    for step in range(world):
        if step < world - 1:
            incoming = torch.empty_like(kv)
            requests = [dist.isend(kv, send_to, group), dist.irecv(incoming, recv_from, group)]
        src = (rank - step) % world
        if not (causal and src > rank):
            part = local_attention(q, kv[0], kv[1], causal=causal and src == rank, scale=scale)
            o, lse = part if o is None else merge_partials(o, lse, *part)
        if step < world - 1:
            for request in requests:
                request.wait()
            kv = incoming
    return o, lse
