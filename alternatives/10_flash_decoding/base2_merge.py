"""Alternative: the merge in base 2 (exp2 of each lse difference times log2 e), an empty split's o never loaded."""
import triton
import triton.language as tl


@triton.jit
def _merge_kernel(O_PART, LSE_PART, O, LSE, num_splits, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr):
    """The solution's merge, its weights exp2((lse_s - M) log2 e) and its log log2(total) ln 2."""
    row = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    cols = tl.arange(0, HEAD_DIM)
    m = tl.full([BLOCK_S], float("-inf"), tl.float32)
    for start in range(0, num_splits, BLOCK_S):
        splits = start + offs_s
        m = tl.maximum(m, tl.load(LSE_PART + row * num_splits + splits, mask=splits < num_splits,
                                  other=float("-inf")))
    top = tl.max(m, 0)
    top = tl.where(top > float("-inf"), top, 0.0)
    l = tl.zeros([BLOCK_S], tl.float32)
    acc = tl.zeros([BLOCK_S, HEAD_DIM], tl.float32)
    for start in range(0, num_splits, BLOCK_S):
        splits = start + offs_s
        live = splits < num_splits
        lse_s = tl.load(LSE_PART + row * num_splits + splits, mask=live, other=float("-inf"))
        w = tl.math.exp2((lse_s - top) * 1.4426950408889634)  # the difference first: lse may be large
        o_s = tl.load(O_PART + (row * num_splits + splits)[:, None] * HEAD_DIM + cols[None, :],
                      mask=(live & (w > 0))[:, None], other=0.0)  # an empty split's o is never loaded
        acc += w[:, None] * o_s
        l += w
    total = tl.sum(l, 0)
    o = tl.sum(acc, 0) / tl.maximum(total, 1e-30)
    tl.store(O + row * HEAD_DIM + cols, o.to(O.dtype.element_ty))
    tl.store(LSE + row, top + tl.math.log2(total) * 0.6931471805599453)
