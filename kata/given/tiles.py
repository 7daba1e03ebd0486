"""Tiles of a (B, H, n, D) tensor, for the kernels of the Triton exercises.

A kernel sees one (batch, head) matrix at a time, n rows of D numbers, and moves it a tile of
rows at a time. Exercises 06, 09, 10 and 14 point at and load such a tile with two device functions:

    ptrs = tiles.row_ptrs(K, b, h, stride_kb, stride_kh, stride_kn, keys, HEAD_DIM)
    k = tiles.load_rows(ptrs, keys, n_k, MASKED)       # (len(keys), HEAD_DIM)

Call them from your @triton.jit code as `tiles.row_ptrs` and `tiles.load_rows`: Triton compiles a
@triton.jit function of another module into the kernel that calls it, as if written there.

Exercise 13 moves its tiles through tensor descriptors instead: the wrapper describes each input
once (`descriptor`, on the host: the tensor, laid out by `tma_aligned`, and a tile's rows), and the
kernel's loads name only a tile's first row (`load_tile`). On an H100 or H200 such a load is one TMA
copy, issued by one thread, with no pointer per element held in registers; rows at or past the
matrix's end read as zeros. Other GPUs, and the interpreter, run it as a masked pointer load.

    k = tiles.load_tile(k_desc, b, h, start, BLOCK_N, HEAD_DIM)  # rows start .. start + BLOCK_N - 1

The backward's numbers per query row, lse and D, lie side by side in one (B, H, 2, n) tensor
(`row_stats`), and a kernel reads both for a tile of rows with one copy (`load_stats`).

HEAD_DIM is the tile's width: tl.arange and every block shape need a power of two, and tl.dot an
inner dimension of at least 16 (float16, bfloat16), so each wrapper pads the caller's D with zero
columns up to padded_width(D) before launching (a zero column adds 0 to every dot product and
gives a zero column of output, which the wrapper cuts off).
"""
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def row_ptrs(base, b, h, stride_b, stride_h, stride_n, rows, HEAD_DIM: tl.constexpr):
    """Pointers (len(rows), HEAD_DIM) to rows `rows`, all columns, of the (b, h) matrix at `base`.

    base points at element [0, 0, 0, 0] of a (B, H, n, HEAD_DIM) tensor whose last axis is
    contiguous; stride_b, stride_h, stride_n are its other strides, in elements.
    """
    start = base + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h  # B·H·n·D may pass 2**31
    return start + rows[:, None] * stride_n + tl.arange(0, HEAD_DIM)[None, :]


@triton.jit
def load_rows(ptrs, rows, n_rows, MASKED: tl.constexpr):
    """Load the tile at `ptrs` (from row_ptrs). MASKED: rows at or past n_rows read as 0 and touch
    no memory; unmasked, every row must lie below n_rows (the load is then cheapest)."""
    if MASKED:
        tile = tl.load(ptrs, mask=(rows < n_rows)[:, None], other=0.0)
    else:
        tile = tl.load(ptrs)
    return tile


@triton.jit
def load_tile(desc, b, h, start, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Rows start .. start + ROWS - 1 of the (b, h) matrix that `desc` (from descriptor(t, ROWS))
    describes, (ROWS, HEAD_DIM); rows at or past its end read as zeros."""
    return desc.load([b, h, start, 0]).reshape(ROWS, HEAD_DIM)


def row_stats(B: int, H: int, n: int, device) -> torch.Tensor:
    """An empty float32 (B, H, 2, n): each (batch, head)'s lse in row 0 and D in row 1, side by side so
    that one TMA copy reads both (load_stats); its rows are stored n rounded up to a multiple of 4
    long, 16 bytes apart or a multiple of it, as a TMA copy needs."""
    return torch.empty((B, H, 2, triton.cdiv(n, 4) * 4), dtype=torch.float32, device=device)[..., :n]


def stats_descriptor(stats: torch.Tensor, rows: int) -> TensorDescriptor:
    """A tensor descriptor of `stats` (from row_stats) whose loads are lse and D of `rows` query rows."""
    return TensorDescriptor(stats, list(stats.shape), list(stats.stride()), [1, 1, 2, rows])


@triton.jit
def load_stats(desc, b, h, start, ROWS: tl.constexpr):
    """lse and D of rows start .. start + ROWS - 1 of (b, h), each (ROWS,); rows at or past the end
    read as zeros. One copy of both: apart, a copy of 16 rows (64 bytes) faults on an H200."""
    return tl.split(tl.trans(desc.load([b, h, 0, start]).reshape(2, ROWS)))


def tma_aligned(t: torch.Tensor) -> torch.Tensor:
    """t itself when a TMA copy can read it (last axis contiguous; every other stride, and the start,
    a multiple of 16 bytes; no stride of 0, as an expanded tensor has, on an axis longer than 1), else a
    copy in fresh memory, which is. TensorDescriptor refuses any other layout, on the GPU and in the
    interpreter alike."""
    aligned = t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(
        stride * t.element_size() % 16 == 0 and (stride > 0 or size == 1)
        for stride, size in zip(t.stride()[:-1], t.shape[:-1]))
    return t if aligned else t.clone(memory_format=torch.contiguous_format)


def descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """A tensor descriptor of t (B, H, n, D), laid out as tma_aligned leaves it, whose loads are tiles
    of `rows` rows of one (batch, head)."""
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, t.shape[-1]])


def padded_width(head_dim: int) -> int:
    """The tile width for a head dimension: the next power of two, at least 16."""
    return max(16, triton.next_power_of_2(head_dim))


def pad_head_dim(t: torch.Tensor, width: int) -> torch.Tensor:
    """t with zero columns appended up to `width` on its last axis, which it makes contiguous.

    Zero columns change no dot product and give zero output columns. A tensor already `width`
    wide and contiguous on its last axis comes back as it is: no copy.
    """
    if t.shape[-1] != width:
        t = torch.nn.functional.pad(t, (0, width - t.shape[-1]))
    return t if t.stride(-1) == 1 else t.contiguous()
