"""Alternative: one stacked K/V tensor per step through isend/irecv; the merge with an explicit max shift."""
import torch
import torch.distributed as dist


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
    kv = torch.stack([k, v])  # a new tensor: contiguous whatever strides k and v have
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
    return o.to(q.dtype), lse.to(q.dtype)  # local_attention's partials are float32 or wider
