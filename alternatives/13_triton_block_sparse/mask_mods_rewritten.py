"""Alternative: the mask mods written another way: the window as a range of differences, the document test under tl.where.

sliding_window_mod keeps 0 <= i - j <= window - 1; document_mod asks for the documents only where
the pair is causal (tl.where(causal, same document, False)); sliding_window and document_mask
check their arguments in another order and build the Mask by keyword.
"""
import torch
import triton
import triton.language as tl

from kata.given.masks import Mask


@triton.jit
def sliding_window_mod(q_idx, kv_idx, window, doc_ids):
    """Causal, and at most window - 1 keys back: 0 <= i - j <= window - 1."""
    back = q_idx - kv_idx
    return (back >= 0) & (back <= window - 1)


def sliding_window(window: int) -> Mask:
    """The mask of sliding_window_mod with this window (at least 1)."""
    window = int(window)
    if not window >= 1:
        raise ValueError(f"sliding_window({window}): the window must be at least 1 (a query sees itself)")
    return Mask(mod=sliding_window_mod, window=window, doc_ids=None)


@triton.jit
def document_mod(q_idx, kv_idx, window, doc_ids):
    """Same document (doc_ids[i] == doc_ids[j]) and causal."""
    same = tl.load(doc_ids + q_idx) == tl.load(doc_ids + kv_idx)
    return tl.where(kv_idx <= q_idx, same, False)


def document_mask(doc_ids: torch.Tensor) -> Mask:
    """The mask of document_mod for packed sequences: doc_ids (n,) an int tensor on the device."""
    if not isinstance(doc_ids, torch.Tensor):
        raise ValueError(f"doc_ids must be a 1-D int tensor, got a {type(doc_ids).__name__}")
    if doc_ids.ndim != 1 or doc_ids.dtype.is_floating_point or doc_ids.dtype.is_complex or doc_ids.dtype == torch.bool:
        raise ValueError(f"doc_ids must be a 1-D int tensor, got {doc_ids.dtype} {tuple(doc_ids.shape)}")
    return Mask(mod=document_mod, doc_ids=doc_ids.int().contiguous())
