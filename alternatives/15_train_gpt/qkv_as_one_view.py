"""Alternative: q, k and v as one view (B, T, 3, n_head, D) permuted to (3, B, n_head, T, D) and unbound;
the heads joined with permute and flatten; the scale 1/sqrt(D) passed explicitly; the packed row's
checks before any product."""
import math

import torch


class CausalSelfAttention(AttentionParameters):
    def forward(self, x: torch.Tensor, doc_ids: torch.Tensor | None = None, seed: int = 0) -> torch.Tensor:
        B, T, C = x.shape
        D = C // self.n_head
        packed = doc_ids is not None
        if packed and self.training and self.dropout > 0:
            raise ValueError("a packed row trains without dropout: 13's kernel has none")
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, D).permute(2, 0, 3, 1, 4).unbind(0)
        if packed:
            mask = document_mask(doc_ids)
            y = block_sparse_attention(q, k, v, block_mask(mask, T, T, BLOCK, BLOCK), mask, scale=1 / math.sqrt(D))
        else:
            p = self.dropout if self.training else 0.0
            y = flash_attention(q, k, v, True, 1 / math.sqrt(D), p, seed)
        return self.proj(y.permute(0, 2, 1, 3).flatten(2))
