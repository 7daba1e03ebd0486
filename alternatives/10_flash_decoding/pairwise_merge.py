"""Alternative: the merge folds each block of splits into a running (o, lse) by 03's pairwise rule."""
import triton
import triton.language as tl


@triton.jit
def _merge_kernel(O_PART, LSE_PART, O, LSE, num_splits, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr):
    """One program: one output row, merging its num_splits partials BLOCK_S at a time.

    O_PART (rows, num_splits, HEAD_DIM) and LSE_PART (rows, num_splits) float32, contiguous;
    O (rows, HEAD_DIM) in the output dtype and LSE (rows,) float32, contiguous.
    """
    row = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    cols = tl.arange(0, HEAD_DIM)
    lse = tl.full([], float("-inf"), tl.float32)
    o = tl.zeros([HEAD_DIM], tl.float32)
    for start in range(0, num_splits, BLOCK_S):  # 03's pairwise merge: the running result with each block
        splits = start + offs_s
        lse_s = tl.load(LSE_PART + row * num_splits + splits, mask=splits < num_splits, other=float("-inf"))
        top = tl.maximum(tl.max(lse_s, 0), lse)
        shift = tl.where(top == float("-inf"), 0.0, top)
        w = tl.exp(lse_s - shift)
        w_run = tl.exp(lse - shift)
        o_s = tl.load(O_PART + (row * num_splits + splits)[:, None] * HEAD_DIM + cols[None, :],
                      mask=((splits < num_splits) & (w > 0))[:, None], other=0.0)
        total = w_run + tl.sum(w, 0)
        o = (w_run * o + tl.sum(w[:, None] * o_s, 0)) / tl.where(total == 0, 1.0, total)
        lse = shift + tl.log(total)
    tl.store(O + row * HEAD_DIM + cols, o.to(O.dtype.element_ty))
    tl.store(LSE + row, lse)
