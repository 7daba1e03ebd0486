"""The GPT of exercise 15, all but its attention layer: GPT-2's blocks at a small size.

    GPT(config, attention)   token and position embeddings, config.n_layer blocks, a final LayerNorm
                             and a head that reuses the token embedding's matrix (GPT-2's tied head)
    Block                    pre-LN: x + attention(LN(x)), then x + MLP(LN(x))
    AttentionParameters      an attention layer's parameters (qkv, proj), its heads and dropout
    Float32Linear            qkv's product, in float32 under autocast: the task is not learned without
    Batch                    what a training step takes: tokens, targets, and for a packed row
                             positions and doc_ids

The attention layer is the class handed in, built as attention(config) and called as
attention(x, doc_ids=..., seed=...): exercise 15's CausalSelfAttention. The shapes, the pre-LN order,
the 4x MLP with GELU, the tied head and the initialisation (normal, std 0.02; the projections into the
residual stream scaled by 1/sqrt(2·n_layer), one per residual branch) are GPT-2's as nanoGPT builds
them (Radford et al., 2019; Karpathy, nanoGPT's model.py).
"""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

IGNORE = -100  # a target the loss skips (cross_entropy's ignore_index): a document's last token has none


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    block_size: int  # positions 0 .. block_size - 1: the longest document
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0  # attention dropout, inside 14's kernel; packed rows (13's kernel) take none


@dataclass
class Batch:
    """tokens and targets (B, T) int64; positions (B, T) or None for 0 .. T - 1 in every row;
    doc_ids (T,) or None: a packed row of several documents (pack makes one row), doc_ids[t] the
    document of token t."""
    tokens: torch.Tensor
    targets: torch.Tensor
    positions: torch.Tensor | None = None
    doc_ids: torch.Tensor | None = None


class Float32Linear(nn.Linear):
    """nn.Linear whose product runs in float32 under autocast, its output then in autocast's dtype.

    The q, k, v projection is one: with its product in bf16 (weights and inputs rounded to 8 bits)
    the 4-layer model stayed at chance on the needle task (12.5% and 17.2% after 200 steps, two
    seeds), where the same product in float32, everything else under the same bf16 autocast and the
    attention's q, k, v still bf16, took its loss below 0.01 by step 100 and scored 100% at step 200
    on both (CPU, torch's attention, n = 256, 16 rows a step, the answers' loss). The output
    projection or the MLP in float32 instead did not help. Off autocast it is nn.Linear."""

    def forward(self, x):
        device = x.device.type
        if not torch.is_autocast_enabled(device):
            return super().forward(x)
        with torch.autocast(device, enabled=False):
            y = super().forward(x.float())
        return y.to(torch.get_autocast_dtype(device))


class AttentionParameters(nn.Module):
    """What an attention layer of the model holds: qkv (C -> 3C: q, k and v of every head in one
    product), proj (C -> C), n_head and the dropout probability. Exercise 15's layer adds forward."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError(f"n_embd = {config.n_embd} must be a multiple of n_head = {config.n_head}")
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.qkv = Float32Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, attention):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = attention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x, doc_ids, seed: int):
        x = x + self.attn(self.ln_1(x), doc_ids=doc_ids, seed=seed)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig, attention):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config, attention) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                std = 0.02 / math.sqrt(2 * config.n_layer) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens, targets=None, positions=None, doc_ids=None, seed: int = 0):
        """logits (B, T, vocab_size), and with targets the mean cross-entropy over the targets not IGNORE.
        seed: the step's; layer i draws its dropout mask from seed · n_layer + i, a mask of its own."""
        B, T = tokens.shape
        if positions is None:
            positions = torch.arange(T, device=tokens.device).expand(B, T)
        if int(positions.max()) >= self.config.block_size:
            raise ValueError(f"a position reaches {int(positions.max())}: the model has block_size = "
                             f"{self.config.block_size} positions")
        x = self.wte(tokens) + self.wpe(positions)  # (B, T, n_embd)
        for i, block in enumerate(self.blocks):
            x = block(x, doc_ids, seed * len(self.blocks) + i)
        logits = self.ln_f(x) @ self.wte.weight.T  # the tied head
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
