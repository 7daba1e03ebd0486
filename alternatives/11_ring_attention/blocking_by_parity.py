"""Alternative: blocking send/recv ordered by rank parity (no overlap); the ring accumulates (m, l, acc)."""
import math
import torch
import torch.distributed as dist


def merge_partials(o_a, lse_a, o_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    out = torch.zeros_like(o_a)
    for o_side, lse_side in ((o_a, lse_a), (o_b, lse_b)):
        live = ~torch.isneginf(lse_side)
        weight = torch.exp(lse_side - torch.where(live, lse, 0.0))
        out = out + torch.where(live[..., None], weight[..., None] * o_side, 0.0)
    return out, lse


def ring_attention(q, k, v, causal=False, scale=None, group=None):
    rank, world, send_to, recv_from = ring_neighbours(group)
    m = torch.full(q.shape[:-1], -math.inf, dtype=q.dtype, device=q.device)
    l = torch.zeros(q.shape[:-1], dtype=q.dtype, device=q.device)
    acc = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    k_held, v_held = k, v
    for step in range(world):
        src = (rank - step) % world
        if not causal or src <= rank:
            o_s, lse_s = local_attention(q, k_held, v_held, causal=causal and src == rank, scale=scale)
            m_new = torch.maximum(m, lse_s)
            shift = torch.where(torch.isneginf(m_new), 0.0, m_new)
            alpha, beta = torch.exp(m - shift), torch.exp(lse_s - shift)
            l = alpha * l + beta
            acc = alpha[..., None] * acc + beta[..., None] * o_s
            m = m_new
        if step == world - 1:
            break
        k_next, v_next = torch.empty_like(k_held), torch.empty_like(v_held)
        # Even ranks send first, odd ranks receive first: no two neighbours both wait to send.
        sends = [(dist.send, k_held, send_to), (dist.send, v_held, send_to)]
        recvs = [(dist.recv, k_next, recv_from), (dist.recv, v_next, recv_from)]
        for op, tensor, peer in sends + recvs if rank % 2 == 0 else recvs + sends:
            op(tensor, peer, group)
        k_held, v_held = k_next, v_next
    o = acc / torch.where(l == 0, 1.0, l)[..., None]
    return o, m + torch.log(l)
