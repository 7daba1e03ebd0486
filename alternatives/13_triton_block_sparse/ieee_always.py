"""Alternative: the dQ kernel multiplies in full float32 (input_precision="ieee") even where torch was asked for TF32.

Slower where the user allowed TF32, never less exact: TF32 is a speed the user may allow, never a
result a test may require.
"""
import triton
import triton.language as tl


@triton.jit
def _dq_tiles(dq, q, do, lse2, delta, rows, k_desc, v_desc, b, h, full, n_full, partial, n_partial, unmasked,
              n_q, n_k, qk_scale, window, doc_ids, MOD: tl.constexpr, RAGGED: tl.constexpr, BLOCK_K: tl.constexpr,
              BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr):
    """Add the key blocks full[:n_full], then partial[:n_partial], BLOCK_N keys at a time, into the
    float32 sum dq of one query tile; the first `unmasked` full blocks without the mask. As 09's
    _dq_tiles, the keys from the lists. PRECISION goes unread: float32 is multiplied in full."""
    offs_n = tl.arange(0, BLOCK_N)
    per_block = BLOCK_K // BLOCK_N
    start = _tile_start(full, n_full, partial, n_partial, 0, BLOCK_K, BLOCK_N)
    for t in tl.range(0, (n_full + n_partial) * per_block):
        keys = start + offs_n
        k = tiles.load_tile(k_desc, b, h, start, BLOCK_N, HEAD_DIM)
        v = tiles.load_tile(v_desc, b, h, start, BLOCK_N, HEAD_DIM)
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")  # as in _dkdv_tiles: the products first, the running sum dq last
        p = tl.math.exp2(s * qk_scale - lse2[:, None])
        if t >= unmasked * per_block:
            p = tl.where(masks.tile_allowed(MOD, rows, keys, n_q, n_k, window, doc_ids, RAGGED), p, 0.0)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision="ieee")
        start = _tile_start(full, n_full, partial, n_partial, t + 1, BLOCK_K, BLOCK_N)
    return dq
