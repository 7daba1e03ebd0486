"""Exercise 15 — train a GPT on your kernels.

The idea
    Exercises 06 to 14 built attention's kernels; here they run inside a model that learns. The
    GPT is given (kata/given/gpt.py: embeddings, pre-LN blocks, an MLP, a tied head), and so are its
    data and its training loop. You write the two pieces that meet the kernels:
      1. the attention layer: project x to q, k, v, split them into heads, run 14's kernel (causal,
         dropout in training), join the heads and project back;
      2. sequence packing: several documents one after another in one row, attended with 13's
         document mask, so that documents of any length train together and no padding is computed.

The layer (x (B, T, C), n_head heads of D = C / n_head; nanoGPT's shapes)
    q, k, v = split(x W_qkv + b_qkv)                   three (B, T, C)
    q → (B, T, n_head, D) → (B, n_head, T, D)          the kernels' layout, as k and v
    y = flash_attention(q, k, v, causal=True, dropout_p, seed)       14's kernel, scale 1/sqrt(D)
    y → (B, T, n_head, D) → (B, T, C);  out = y W_proj + b_proj
    dropout_p is the config's in training mode (module.training) and 0 in evaluation. The model
    hands each layer a seed of its own at each step: a mask of its own, redrawn in the backward.

Packing
    Padding a batch of documents to its longest wastes the kernel's time on pairs that are thrown
    away. Packing puts them end to end in one row, with doc_ids[t] the document of token t, and
    attends with 13's document_mask (same document, and causal within it): 13's block mask lists
    only the tiles where some pair shares a document, so a row of many short documents costs in
    proportion to Σ len², not (Σ len)². For a packed row to give each document exactly what it
    would get alone, three things restart at each document:
        attention   doc_ids: no token sees another document
        positions   0, 1, 2, ... from each document's first token
        targets     each token's next token in its document; the last has none (IGNORE)
    13's kernel has no dropout: a packed row in training with dropout_p > 0 raises ValueError
    (train packed rows with dropout 0, as GPT pretraining mostly does).

In the paper
    FlashAttention (Dao et al., 2022), section 4: GPT-2 trained with its kernels, dropout inside
    (Algorithm 2), up to 3.5x faster than HuggingFace's implementation and 1.7x Megatron-LM's
    (Table 2); and on Path-X (16k tokens a problem) the first Transformer above chance, once the
    context holds the whole problem (section 4.2). The long-range task here (kata/given/needle.py)
    is of that kind: a needle anywhere in the row.

Conventions
    - x (B, T, C) float32 (14's and 13's kernels take float16 and bfloat16 too), any T >= 1.
    - The layer's parameters are the given ones (qkv, proj), so that the tests can build torch's
      reference from them: scaled_dot_product_attention with 14's dropout_mask(seed, ...).
    - doc_ids (T,) int: the documents of a packed row (of every row of x, if several: 13's block
      mask is one for the whole batch).
    - pack(documents): one row of N = Σ len tokens, nothing added, in the documents' order.

Given (kata/given/)
    gpt.py     GPTConfig, GPT, Block, MLP, AttentionParameters (your layer's qkv, proj, n_head,
               dropout), Batch (tokens, targets, positions, doc_ids), IGNORE
    needle.py  the documents (filler, a needle, the question) and the task's accuracy
    train.py   the training loop: python grader.py train runs it on your layer
    solved.py  solved("14").flash_attention, solved("13")'s document_mask, block_mask, block_sparse_attention:
               the reference's for the tests; python grader.py train runs yours once they pass
"""
import torch

from kata.given import gpt
from kata.given.gpt import AttentionParameters, Batch
from kata.given.launch import interpreted
from kata.given.solved import solved

flash_attention = solved("14").flash_attention  # (q, k, v, causal, scale, dropout_p, seed) -> o
document_mask = solved("13").document_mask  # doc_ids (n,) -> a Mask: same document, causal within
block_mask = solved("13").block_mask  # (mask, n_q, n_k, block_q, block_k) -> the tiles to visit
block_sparse_attention = solved("13").block_sparse_attention  # (q, k, v, block_mask, mask) -> o
IGNORE = gpt.IGNORE  # the target the loss skips: a document's last token has none
BLOCK = 32 if interpreted() else 128  # the block mask's blocks: the interpreter's tiles are 16, a GPU's up to 128


def pack(documents: list[torch.Tensor]) -> Batch:
    """Documents (1-D int64 tensors of tokens, each at least 1 long) end to end in one row: a Batch of
    tokens, targets and positions (1, N) and doc_ids (N,), N the documents' total length."""
    # TODO: concatenate the tokens; each document's targets are its tokens shifted by one, IGNORE
    #       last; positions count 0, 1, ... within each document; doc_ids[t] the document of token t.
    # BEGIN SOLUTION
    tokens = torch.cat(documents)
    targets = torch.cat([torch.cat([d[1:], d.new_full((1,), IGNORE)]) for d in documents])
    positions = torch.cat([torch.arange(len(d), device=d.device) for d in documents])
    doc_ids = torch.cat([torch.full((len(d),), i, device=d.device) for i, d in enumerate(documents)])
    return Batch(tokens[None], targets[None], positions[None], doc_ids)
    # END SOLUTION


class CausalSelfAttention(AttentionParameters):
    """Multi-head causal self-attention on 14's kernel, or on 13's for a packed row; its parameters
    (self.qkv, self.proj), self.n_head and self.dropout are given (kata/given/gpt.py)."""

    def forward(self, x: torch.Tensor, doc_ids: torch.Tensor | None = None, seed: int = 0) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C). doc_ids None: causal over each row, dropout in training (14's
        kernel, mask dropout_mask(seed, ...)). doc_ids (T,): a packed row (pack makes one), each token
        attending the earlier tokens of its own document (13's kernel, document_mask(doc_ids))."""
        # TODO: q, k, v from self.qkv, each (B, n_head, T, D); 14's flash_attention (causal, dropout_p
        #       the config's while self.training, else 0) or, with doc_ids, 13's block_sparse_attention
        #       under document_mask(doc_ids) with blocks of BLOCK (ValueError for dropout in training);
        #       the heads joined back to (B, T, C), then self.proj.
        # BEGIN SOLUTION
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        if doc_ids is None:
            y = flash_attention(q, k, v, causal=True, dropout_p=self.dropout if self.training else 0.0, seed=seed)
        else:
            if self.training and self.dropout > 0:
                raise ValueError(f"packed rows run 13's kernel, which has no dropout: train them with dropout 0, "
                                 f"not {self.dropout}")
            mask = document_mask(doc_ids)
            y = block_sparse_attention(q, k, v, block_mask(mask, T, T, BLOCK, BLOCK), mask)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))
        # END SOLUTION
