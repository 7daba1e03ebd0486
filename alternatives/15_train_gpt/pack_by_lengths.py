"""Alternative: pack without a loop over the fields: doc_ids by repeat_interleave of the lengths,
positions as the index minus the document's first index, targets as the row shifted by one with
IGNORE where the next token starts a document."""
import torch


def pack(documents: list[torch.Tensor]) -> Batch:
    tokens = torch.cat(documents)
    lengths = torch.tensor([len(d) for d in documents], device=tokens.device)
    doc_ids = torch.repeat_interleave(torch.arange(len(documents), device=tokens.device), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    positions = torch.arange(len(tokens), device=tokens.device) - starts[doc_ids]
    last = torch.cumsum(lengths, 0) - 1
    targets = torch.roll(tokens, -1)
    targets[last] = IGNORE
    return Batch(tokens.unsqueeze(0), targets.unsqueeze(0), positions.unsqueeze(0), doc_ids)
