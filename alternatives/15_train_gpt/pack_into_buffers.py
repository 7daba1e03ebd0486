"""Alternative: pack into buffers allocated once at the row's length, each document written into its
slice in a loop."""
import torch


def pack(documents: list[torch.Tensor]) -> Batch:
    n = sum(len(d) for d in documents)
    device = documents[0].device
    tokens = torch.empty(n, dtype=torch.int64, device=device)
    targets = torch.full((n,), IGNORE, dtype=torch.int64, device=device)
    positions = torch.empty(n, dtype=torch.int64, device=device)
    doc_ids = torch.empty(n, dtype=torch.int64, device=device)
    at = 0
    for i, d in enumerate(documents):
        end = at + len(d)
        tokens[at:end] = d
        targets[at:end - 1] = d[1:]
        positions[at:end] = torch.arange(len(d), device=device)
        doc_ids[at:end] = i
        at = end
    return Batch(tokens[None], targets[None], positions[None], doc_ids)
