"""Tests for exercise 13: the block-sparse kernels, forward and backward through torch.autograd,
against float64 autograd of dense attention under a dense mask built here from each mask's
definition (never from the code under test).

Every check builds the block mask with `block_mask` (given) from your mask, compares its lists with
a brute-force classification of the dense mask (so your mask mods are checked there too), then
overwrites every entry past a count, and fills with NaN the K and V of key blocks no query block
lists and the Q and dO of query blocks no key block lists: a kernel that reads an unlisted tile or
an entry past a count shows it. Without a CUDA device the kernels run in Triton's interpreter on
the CPU (float32 and float16, small ragged shapes, blocks of 16 and 32); with one, the tests marked
gpu add float16, bfloat16 and float32 at thousands of tokens and a training run beside torch's SDPA.
Each test's name says the bug it catches.
"""
import dataclasses
import itertools
import math
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np
import pytest

import oracles
from checks import assert_unmodified
from spies import observed

torch = pytest.importorskip("torch", reason="skipped: exercise 13 needs PyTorch")
import bounds_check  # noqa: E402 - only once torch is known to import
from oracles_torch import attention, attention_grads  # noqa: E402
# Before Triton loads: without CUDA, triton_helpers sets TRITON_INTERPRET=1, which Triton reads then.
from triton_helpers import (BACKWARD_TOL, DEVICE, DTYPES, INTERPRETED, LOG_OF_ZERO_WANTED, WRAPPER_BAD_INPUTS, as_numpy,  # noqa: E402
                            backward_bounds, call, check_compiles_for_gpus, check_outputs, forward_backward, gpu,
                            interpreted_only, poisoned_buffers, qkv_do, randn, record_by_launch, shape_id,  # noqa: F401
                            skip_unless_supported, small_qk, tolerance)
from triton_helpers import FLOAT32, GYM_SHAPE, torch_default_float32  # noqa: E402, F401 (a fixture)
from requires_grad import FROZEN, check_frozen  # noqa: E402
from rounding_inputs import cancelling_dv_inputs, dv_summed, large_d_inputs  # noqa: E402
from training import TRAIN, check_training  # noqa: E402

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kata.given.block_mask import BlockMask  # noqa: E402
from kata.given import masks as given_masks, sparse_launch  # noqa: E402

# P is rebuilt before the mask zeroes it (overflow to inf, unused); a fully masked row has lse = log(0).
pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"),
              LOG_OF_ZERO_WANTED]
MASKS = ("causal: j <= i; sliding_window(w): i - w < j <= i; document_mask(ids): ids[i] == ids[j] and j <= i "
         "(query i, key j, top-left aligned also when n_q != n_k)")
FORMULAS = ("P = exp(scale·QKᵀ − lse) on the allowed pairs, dV = Pᵀ dO, dS = P ∘ (dO Vᵀ − D), "
            "dQ = scale · dS K, dK = scale · dSᵀ Q")
WALK = ("per query block i the forward and dQ walk full_kv_indices[i, :full_kv_num_blocks[i]] unmasked and "
        "kv_indices[i, :kv_num_blocks[i]] masked; dK, dV of key block j walk the transposed lists q_indices[j], "
        "full_q_indices[j]; the mask applies on partial tiles")
MASKED_ROW = ("a row no key may attend gives o = 0 and zero gradients, never NaN: subtract 0 while m is -inf, "
              "and zero P with tl.where (lse = -inf makes P = inf there), never a product with the mask")
PAST_COUNT = ("entries past a count are garbage, and past a list's last row lies the end of its tensor: no "
              "kernel reads them (mask the load of the walk's next entry to the walk, e < n_full + n_partial)")
UNREAD = ("NaN here, none when the same inputs run without their NaN: a tile no list names was read (NaN fills "
          "the K, V of key blocks no query block lists, the Q, dO of query blocks no key block lists, and the blocks "
          "named by entries past each count: never read past kv_num_blocks[i], full_kv_num_blocks[i], "
          "q_num_blocks[j], full_q_num_blocks[j])")
UNWRITTEN = ("NaN with every input finite and the lists clean too: made by the arithmetic (exp2(-inf - (-inf)) in a row "
             "that has seen no key yet: subtract 0 while m is -inf; inf · 0 where tl.where belongs; 0 / 0), or an "
             "output element never written (outputs start as NaN: every program stores all its rows or keys below n), "
             "or D or lse read before a kernel stores it")
RAGGED_BLOCKS = ("a full block that the walked axis's end cuts is masked as partial blocks are (keys past n_k, rows "
                 "past n_q weigh 0), and it is a list's last full block (masks.ends_ragged)")


# ---- the masks, as the tests define them ---------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """A mask as the learner builds it (`make(ex)`) and as its definition says (`pairs(n_q, n_k)`)."""
    label: str
    make: Callable
    pairs: Callable  # (n_q, n_k) -> bool tensor on DEVICE, True where query i may attend key j


def grid(n_q, n_k):
    return torch.arange(n_q, device=DEVICE)[:, None], torch.arange(n_k, device=DEVICE)[None, :]


def causal():
    return Case("causal", lambda ex: ex.causal, lambda n_q, n_k: (lambda i, j: j <= i)(*grid(n_q, n_k)))


def window(w):
    return Case(f"sliding_window({w})", lambda ex: ex.sliding_window(w),
                lambda n_q, n_k: (lambda i, j: (j <= i) & (i - w < j))(*grid(n_q, n_k)))


def documents(ids, strided=False):
    """document_mask of ids (n,), a NumPy int array: int64 on the device, as a caller might pass it;
    strided: int32, every other element of a tensor twice as long (a view the kernels cannot index
    as it is)."""
    lengths = [len(list(run)) for _, run in itertools.groupby(ids.tolist())]
    ids_t = torch.as_tensor(ids, device=DEVICE)

    def passed():
        return torch.as_tensor(ids, dtype=torch.int32, device=DEVICE).repeat_interleave(2)[::2] if strided else ids_t.clone()

    def pairs(n_q, n_k):
        i, j = grid(n_q, n_k)
        return (ids_t[:n_q, None] == ids_t[None, :n_k]) & (j <= i)
    label = f"document_mask({'a strided int32 view of ' if strided else ''}documents of lengths {lengths})"
    return Case(label, lambda ex: ex.document_mask(passed()), pairs)


def doc_ids(rng, n, docs=5):
    """Document ids over n positions: `docs` or so documents of random lengths, one of them a single
    token, named out of order."""
    cuts = set(rng.choice(np.arange(1, n - 1), size=docs - 2, replace=False).tolist())
    cuts.add(int(rng.choice(sorted(cuts))) + 1)  # the document starting at that cut is one token long
    return oracles.documents_named_out_of_order(rng, np.searchsorted(sorted(cuts), np.arange(n), side="right"))


# ---- the brute-force block mask, and the checks of ex.block_mask's lists --------------------------

def tile_kinds(allowed, block_q, block_k):
    """(partial, full) bool (T_r, T_c) CPU tensors from the dense mask (oracles.tile_kinds)."""
    return tuple(torch.from_numpy(grid) for grid in oracles.tile_kinds(allowed.cpu().numpy(), block_q, block_k))


LIST_NAMES = [("kv_num_blocks", "kv_indices", "partial", "query"), ("full_kv_num_blocks", "full_kv_indices", "full", "query"),
              ("q_num_blocks", "q_indices", "partial", "key"), ("full_q_num_blocks", "full_q_indices", "full", "key")]


def check_lists(bm, partial, full, what):
    """ex.block_mask's lists against the brute-force classification: counts, and indices ascending."""
    __tracebackhide__ = True
    assert isinstance(bm, BlockMask), f"{what}: expected a BlockMask, got {type(bm).__name__}"
    kinds = {"partial": partial, "full": full}
    for counts, indices, kind, per in LIST_NAMES:
        grid_ = kinds[kind] if per == "query" else kinds[kind].T
        got_counts, got_indices = getattr(bm, counts).cpu(), getattr(bm, indices).cpu()
        for b, row in enumerate(grid_):
            want = torch.nonzero(row).flatten().tolist()
            got = got_indices[b, :int(got_counts[b])].tolist()
            if got != want:
                raise AssertionError(
                    f"{what}: {per} block {b}: {indices}[{b}, :{counts}[{b}]] = {got}, expected the {kind} blocks "
                    f"{want}\n  convention: block_mask is given; it classifies tiles by asking your mask mod, so a "
                    f"wrong list means a wrong mod ({MASKS})")


def with_garbage(bm, partial, full, rng):
    """bm with every entry past each count overwritten: by a block nobody lists (its rows hold NaN)
    where there is one, else by a block the row does list (read twice, it counts twice); each index
    tensor the start of a buffer one row longer, so that a read past its end reads garbage too (and,
    in the interpreter, is named: past_counts); and its program orders shuffled: any order gives the same answer, but a kernel that takes its lists from
    the order and its rows from the program's number does not (the given orders of causal-like masks
    on the CPU's sizes put key block 0 first, as the program numbers do)."""
    listed = partial | full
    dead = {"query": torch.nonzero(~listed.any(0)).flatten(), "key": torch.nonzero(~listed.any(1)).flatten()}
    lists = {"query": listed, "key": listed.T}
    changes = {}
    for counts, indices, _, per in LIST_NAMES:
        rows, blocks = getattr(bm, indices).shape
        idx = torch.cat([getattr(bm, indices).cpu(), torch.zeros(1, blocks, dtype=getattr(bm, indices).dtype)])
        for b in range(rows + 1):
            pool = dead[per] if len(dead[per]) else torch.nonzero(lists[per][min(b, rows - 1)]).flatten()
            pool = pool if len(pool) else torch.arange(blocks)
            past = int(getattr(bm, counts)[b]) if b < rows else 0
            idx[b, past:] = pool[torch.from_numpy(rng.integers(len(pool), size=blocks - past))].to(idx.dtype)
        changes[indices] = idx.to(getattr(bm, indices).device)[:rows]
    for order in ("kv_order", "q_order"):
        blocks = getattr(bm, order)
        changes[order] = blocks[torch.from_numpy(rng.permutation(len(blocks))).to(blocks.device)].contiguous()
    return dataclasses.replace(bm, **changes)


def past_counts(bm):
    """(start, stop, describe) byte ranges of every list entry past its count and of the row past each
    index tensor's end (with_garbage's), for bounds_check.watch: no kernel may read them."""
    ranges = []
    for counts, indices, _, _ in LIST_NAMES:
        idx, n = getattr(bm, indices), getattr(bm, counts).tolist()
        rows, blocks = idx.shape
        base, size = idx.data_ptr(), idx.element_size()

        def describe(address, indices=indices, counts=counts, n=n, rows=rows, blocks=blocks, base=base, size=size):
            row, entry = divmod((address - base) // size, blocks)
            return (f"{indices}[{row}, {entry}], past {counts}[{row}] = {n[row]}" if row < rows else
                    f"past the end of {indices} ({rows}, {blocks})")
        ranges += [(base + (row * blocks + count) * size, base + (row + 1) * blocks * size, describe)
                   for row, count in enumerate(n + [0]) if count < blocks]
    return ranges


def poison_unlisted(q, k, v, do, partial, full, block_q, block_k):
    """Copies with NaN in K, V of every key block no query block lists and Q, dO of every query block
    no key block lists; and the poisoned ranges, for the failure message."""
    listed = partial | full
    q, k, v, do = (t.clone() for t in (q, k, v, do))
    notes = []
    for dead, block, tensors, name in ((~listed.any(0), block_k, (k, v), "keys"), (~listed.any(1), block_q, (q, do), "queries")):
        for j in torch.nonzero(dead).flatten().tolist():
            for t in tensors:
                t[:, :, j * block:(j + 1) * block] = float("nan")
        if dead.any():
            notes.append(f"{name} of blocks {torch.nonzero(dead).flatten().tolist()} listed by none hold NaN")
    return q, k, v, do, notes


# ---- running and checking ------------------------------------------------------------------------

def run(ex, q, k, v, do, bm, mask, scale=None):
    """o and (dq, dk, dv) from the kernels; a stubbed kernel body surfaces as NotImplementedError."""
    kwargs = {} if scale is None else {"scale": scale}
    return forward_backward(lambda *t: ex.block_sparse_attention(*t, bm, mask, **kwargs), q, k, v, do)


def run_watched(ex, q, k, v, do, bm, mask, scale, what):
    """run, with every address the interpreter's kernels load or store checked (tests/bounds_check.py):
    no list entry past its count (past_counts), nothing outside the tensors a launch was given."""
    __tracebackhide__ = True
    if not (INTERPRETED and bounds_check.available()):
        return run(ex, q, k, v, do, bm, mask, scale)
    with bounds_check.watch(past_counts(bm), what, PAST_COUNT, {k: f"{name} ({k})" for k, (name, _) in KERNELS.items()}):
        return run(ex, q, k, v, do, bm, mask, scale)


def build(ex, case, n_q, n_k, block_q, block_k):
    """The learner's mask, ex.block_mask of it, and the brute-force (allowed, partial, full)."""
    __tracebackhide__ = True
    mask = call(case.make, ex)
    what = f"block_mask({case.label}, n_q={n_q}, n_k={n_k}, block_q={block_q}, block_k={block_k})"
    bm = call(ex.block_mask, mask, n_q, n_k, block_q, block_k)
    allowed = case.pairs(n_q, n_k)
    partial, full = tile_kinds(allowed, block_q, block_k)
    check_lists(bm, partial, full, what)
    return mask, bm, allowed, partial, full


def check(ex, rng, case, q, k, v, do, block_q, block_k, scale=None, convention=FORMULAS, tol=None):
    """Build the block mask (checking its lists), spoil what must not be read, run forward and
    backward, check the inputs are unmodified, then o, dq, dk, dv against float64 autograd."""
    __tracebackhide__ = True
    n_q, n_k = q.shape[2], k.shape[2]
    mask, bm, allowed, partial, full = build(ex, case, n_q, n_k, block_q, block_k)
    listed, finite = bm, (q, k, v, do)
    bm = with_garbage(bm, partial, full, rng)
    q, k, v, do, notes = poison_unlisted(q, k, v, do, partial, full, block_q, block_k)
    empty = torch.nonzero(~allowed.any(1)).flatten().tolist()
    if empty:
        notes.append(f"queries {empty[0]}-{empty[-1]} may attend no key" if empty == list(range(empty[0], empty[-1] + 1))
                     else f"queries {empty} may attend no key")
    notes += [f"scale={scale}"] if scale is not None else []
    what = (f"block_sparse_attention(q {tuple(q.shape)} {str(q.dtype)[6:]}, k/v {tuple(k.shape)}, {case.label}, "
            f"block_q={block_q}, block_k={block_k}{''.join(', ' + n for n in notes)}).backward(do)")
    before = [t.clone() for t in (q, k, v, do)]
    o, grads = run_watched(ex, q, k, v, do, bm, mask, scale, what)
    for t, t0, label in zip((q, k, v, do), before, ("q", "k", "v", "do")):
        assert_unmodified(as_numpy(t0), as_numpy(t), label, what)
    clean_do = do.nan_to_num()  # NaN only in query blocks none lists: o = 0 there, and no gradient flows
    o_ref, grads_ref = attention_grads(q, k, v, clean_do, keep=allowed, scale=scale)
    tol = tol or tolerance(q.dtype, BACKWARD_TOL)
    bounds = backward_bounds(q, k, v, clean_do, o, o_ref, keep=allowed, scale=scale)  # compiled float16, bfloat16
    clean = dataclasses.replace(listed, kv_order=bm.kv_order, q_order=bm.q_order)  # the orders as this run's
    nan = nan_cause((o, *grads), lambda: run(ex, *finite, clean, mask, scale), bool(empty))
    hint = lse_hint(grads[0], grads_ref[0], attention(q, k, v, keep=allowed, scale=scale)[1], tol)
    outputs = zip(("o", "dq", "dk", "dv"), "qqkv", (q, q, k, v), (o, *grads), (o_ref, *grads_ref),
                  bounds or (None,) * 4)
    check_outputs(what, outputs, tol, f"{convention}; {MASKS}{hint}", nan)


def nan_cause(outputs, rerun, empty_rows: bool) -> str:
    """What a NaN among `outputs` means, for its message: rerun() runs the same call on the inputs
    without their NaN and with the lists as block_mask made them. NaN gone: a poisoned tile was read;
    NaN still there: an output never written or a row no key may attend."""
    if not any(t.isnan().any() for t in outputs):
        return ""
    o, grads = rerun()
    if not any(t.isnan().any() for t in (o, *grads)):
        return UNREAD
    return f"{MASKED_ROW}; or {UNWRITTEN}" if empty_rows else UNWRITTEN


# dQ's row i comes out exp(c · lse_i) times the right one when the backward rebuilds P = exp(scale·s − lse')
# from a wrong lse' = lse · (1 − c): stored in base 2 (lse / ln 2), or the natural lse taken for base 2 in
# the dQ kernel (exp2(s · scale · log2 e − lse) = exp(scale·s − lse · ln 2)).
LSE_MIXUPS = {1 - 1 / math.log(2): "the backward rebuilt P from lse in base 2 (lse / ln 2): store the natural lse, "
              "(m + log2 l) · ln 2", 1 - math.log(2): "the dQ kernel subtracted the natural lse from scores in "
              "base 2: multiply lse by log2 e first"}


def lse_hint(dq, dq_ref, lse_ref, tol) -> str:
    """A sentence for the message when dQ is wrong in the way a mixed-up base of lse makes it."""
    dq, dq_ref, lse_ref = (t.detach().double().cpu() for t in (dq, dq_ref, lse_ref))
    atol = tol * max(1.0, dq_ref.abs().max().item())
    if torch.allclose(dq, dq_ref, rtol=tol, atol=atol):
        return ""
    for c, cause in LSE_MIXUPS.items():
        scaled = dq_ref * torch.exp(c * lse_ref).nan_to_num(0.0, posinf=0.0)[..., None]
        if torch.allclose(dq, scaled, rtol=tol, atol=atol):
            return f"; here each row i of dQ is exp({c:.3f} · lse_i) times the right one: {cause}"
    return ""


def case_id(s):
    return "b{}-h{}-nq{}-nk{}-d{}-bq{}-bk{}".format(*s)


# ---- the mask mods, pair by pair ----------------------------------------------------------------

@triton.jit
def _pairs(OUT, MOD: tl.constexpr, window, doc_ids, n_q, n_k, ROWS: tl.constexpr, KEYS: tl.constexpr):
    """OUT (ROWS, KEYS) int8: tile_allowed of MOD over every (query, key) pair at once."""
    rows, keys = tl.arange(0, ROWS), tl.arange(0, KEYS)
    allowed = given_masks.tile_allowed(MOD, rows, keys, n_q, n_k, window, doc_ids, True)
    tl.store(OUT + rows[:, None] * KEYS + keys[None, :], allowed.to(tl.int8))


def check_mod(ex, case, n_q, n_k):
    __tracebackhide__ = True
    mask = call(case.make, ex)
    rows, keys = triton.next_power_of_2(n_q), triton.next_power_of_2(n_k)
    out = torch.zeros(rows, keys, dtype=torch.int8, device=DEVICE)
    call(_pairs[(1,)], out, mask.mod, mask.window, mask.doc_ids, n_q, n_k, ROWS=rows, KEYS=keys)
    got, want = out[:n_q, :n_k].bool().cpu(), case.pairs(n_q, n_k).cpu()
    wrong = torch.nonzero(got != want)
    if len(wrong):
        i, j = wrong[0].tolist()
        raise AssertionError(f"{case.label}'s mod on {n_q} queries x {n_k} keys: pair (query {i}, key {j}) gives "
                             f"{bool(got[i, j])}, expected {bool(want[i, j])} ({len(wrong)} pairs wrong)\n"
                             f"  convention: {MASKS}")


@pytest.mark.parametrize("w", [1, 3, 10])
def test_sliding_window_mod(ex, w):
    """A window one too wide or narrow (q_idx - kv_idx <= window), or not causal (keys ahead seen)."""
    check_mod(ex, window(w), 20, 23)


def test_document_mod(ex, rng):
    """The document test dropped, or documents not causal inside (a query sees later keys of its document)."""
    check_mod(ex, documents(doc_ids(rng, 23)), 23, 19)


def test_sliding_window_refuses_a_window_below_one(ex):
    """sliding_window(0) accepted: no query could see even itself."""
    with pytest.raises(ValueError, match="window"):
        ex.sliding_window(0)


# (n_q, n_k, block_q, block_k); at 300 x 300 in blocks of 16 a row lists up to 19 blocks, where an unstable sort
# (torch's and NumPy's, from 17 on) puts them out of order
SHAPES = [(8, 8, 16, 16), (45, 45, 16, 32), (70, 37, 32, 16), (33, 90, 16, 32), (300, 300, 16, 16)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "nq{}-nk{}-bq{}-bk{}".format(*s))
def test_block_mask_matches_brute_force(ex, rng, shape):
    """The learner's mods as block_mask (given) sees them, on the device: a mod wrong on some pair, or
    one that reads doc_ids out of bounds, lists a partial tile as full or empty, or a full one as partial."""
    for case in (causal(), window(5), documents(doc_ids(rng, max(shape[:2]), 4))):
        build(ex, case, *shape)


# ---- block_sparse_attention against float64 autograd --------------------------------------------

@pytest.mark.parametrize("shape", [(1, 2, 45, 45, 16, 16, 32), (1, 1, 100, 130, 16, 32, 16)], ids=case_id)
def test_causal_matches_autograd(ex, rng, shape):
    """A partial block run unmasked, a block's tiles missing or walked twice, the ragged last block
    dropped or its walk begun at the wrong tile (key block 0's full query blocks are 1, 2 and the
    ragged 3), a wrong formula (D missing, scale left out of dK or dQ), dK, dV over the forward's lists
    instead of the transposed ones; keys past the last query are attended by none (dk = dv = 0)."""
    B, H, n_q, n_k, D, block_q, block_k = shape
    check(ex, rng, causal(), *qkv_do(rng, B, H, n_q, n_k, D), block_q, block_k, convention=f"{FORMULAS}; {WALK}")


def test_sliding_window_matches_autograd(ex, rng):
    """The window off by one, partial blocks unmasked, a full block cut by the end of the keys or the
    queries run unmasked; n_q > n_k, block_q > block_k."""
    check(ex, rng, window(19), *qkv_do(rng, 1, 1, 70, 53, 16), 32, 16, convention=f"{FORMULAS}; {WALK}")


def test_document_mask_matches_autograd(ex, rng):
    """Documents not causal inside, or seeing each other; rows whose first listed tiles are all masked
    (a document that starts mid-block); a document of one token."""
    ids = doc_ids(rng, 77, 6)
    check(ex, rng, documents(ids), *qkv_do(rng, 1, 1, 61, 77, 16), 16, 32, convention=f"{FORMULAS}; {WALK}")


def test_document_ids_as_a_strided_view(ex, rng):
    """doc_ids kept as passed: the mod indexes doc_ids + i, which a strided view does not hold."""
    check(ex, rng, documents(doc_ids(rng, 50, 4), strided=True), *qkv_do(rng, 1, 1, 50, 50, 16), 16, 16,
          convention="document_mask keeps its ids as int32, contiguous: the kernels index them")


@pytest.mark.parametrize("mask", ["causal", "window", "documents"])
def test_sizes_that_are_multiples_of_the_blocks(ex, rng, mask):
    """RAGGED taken for whether to mask at all: where no end cuts a block (RAGGED False, as at 2k or
    64k tokens), partial tiles left unmasked. Of the other tests only the lse test's size is even, and
    it would name another bug; here every mask, n_q != n_k and block_q != block_k."""
    case = {"causal": causal(), "window": window(21), "documents": documents(doc_ids(rng, 96, 5))}[mask]
    check(ex, rng, case, *qkv_do(rng, 1, 1, 64, 96, 16), 32, 16,
          convention=f"{WALK}; RAGGED (masks.ragged: does an end cut a block?) decides tile_allowed's bounds, "
                     "never which tiles are masked")


def test_kernel_tiles_of_two_sizes(ex, rng, monkeypatch):
    """BLOCK_M and BLOCK_N taken for each other: a program's list row found from the other tile size,
    or the tiles it walks sized as its own. The interpreter's tiles are square, but a GPU's are not
    (dK, dV walk 64 query rows per 128 keys, dQ 64 keys per 128 rows); here every kernel gets two sizes."""
    tiles = dict(fwd=(16, 32, 4, 2), dkdv=(16, 32, 4, 2), dq=(32, 16, 4, 2))
    inputs = tuple(qkv_do(rng, 1, 2, 70, 53, 16))
    with monkeypatch.context() as patched:
        patched.setattr(sparse_launch, "kernel_tiles", lambda block_mask, width, itemsize: tiles)
        try:
            check(ex, rng, causal(), *inputs, 32, 32,
                  convention=f"tiles (BLOCK_M, BLOCK_N) {tiles}: BLOCK_M rows of queries, BLOCK_N keys; {WALK}")
            return
        except AssertionError as two_sizes:
            failure = two_sizes
    # The same call at the interpreter's square tiles: failing there too, the bug is not the tile sizes
    # (70 x 53 cuts a block at both ends, so a ragged block's bug shows here first).
    check(ex, rng, causal(), *inputs, 32, 32, convention=f"{WALK}; {RAGGED_BLOCKS}")
    raise failure


def test_fully_masked_rows_give_zero_not_nan(ex, rng):
    """exp2(-inf - (-inf)) = NaN in the forward for a row no key may attend (no guard while m = -inf),
    or P = inf times a zero mask = NaN in the backward (a product where tl.where belongs). A window of
    8 over 40 keys leaves queries 47-59 with nothing: 47 inside a listed tile, 48-59 in a block none lists."""
    check(ex, rng, window(8), *qkv_do(rng, 1, 1, 60, 40, 16), 16, 32, convention=MASKED_ROW)


@pytest.mark.usefixtures("torch_default_float32")  # TF32 products would move P by a percent at these scores
def test_large_scores_do_not_overflow(ex, rng):
    """exp2 of raw scores (no max subtracted), lse in the wrong base, or m set to 0 while a row has
    seen nothing: every score here is below -300 in base 2, so a later tile underflows to l = 0."""
    # Multiples of 1/8 are exact in float32, so the scores carry little rounding error of their own.
    q, k, v, do = qkv_do(rng, 1, 1, 40, 40, 16)
    shift = torch.zeros(16, device=DEVICE)
    shift[0] = 24.0  # q · k = -576 + noise: scores (scale 1/4) near -144, -208 in base 2
    q, k = (((t * 4 * 8).round().clamp(-160, 160) / 8) + sign * shift for t, sign in ((q, 1), (k, -1)))
    v, do = ((t * 8).round() / 8 for t in (v, do))
    # A first document into query block 1, then one of one token: that row's first listed tile (key block 0) is all masked.
    first = int(rng.integers(17, 28))
    second = int(rng.integers(1, 40 - first - 1))
    ids = np.repeat(np.arange(4), [first, 1, second, 40 - first - 1 - second])
    check(ex, rng, documents(ids), q, k, v, do, 16, 16, tol=1e-4,
          convention="subtract the running max before exp2, and keep m = -inf (subtracting 0) until a row sees a key; "
                     "P = exp2(S·scale·log2(e) − lse·log2(e)) with lse the natural log")


def test_each_tensor_read_and_written_with_its_own_strides(ex, rng):
    """One tensor's strides used for another: V read (or its tiles stepped) with K's strides, dO with
    q's, dV stored with dK's. q and k here are (B, n, H, D) tensors viewed as (B, H, n, D), as a
    model's projections or a KV cache give them, v is contiguous, and dO is a third layout
    (autograd's dk and dv are made like k and v, so they differ too)."""
    q, k = (randn(rng, 2, n, 2, 16).transpose(1, 2) for n in (20, 29))
    v = randn(rng, 2, 2, 29, 16)
    do = randn(rng, 20, 2, 2, 16).permute(2, 1, 0, 3)
    check(ex, rng, window(12), q, k, v, do, 16, 16, convention="read and write each tensor with its own strides")


def test_inputs_laid_out_as_no_tma_copy_reads(ex, rng):
    """A q that starts 4 bytes into its buffer, and a k whose rows lie 68 bytes apart: a TMA copy
    needs 16-byte starts and strides, so the wrapper copies them for the descriptors (given:
    kata/given/tiles.py, tma_aligned). They are the leaves themselves, not copies (a copy would align them)."""
    q = randn(rng, 20 * 16 + 1)[1:].view(1, 1, 20, 16).requires_grad_()
    k = randn(rng, 1, 29, 1, 17)[..., :16].transpose(1, 2).requires_grad_()
    v, do = randn(rng, 1, 1, 29, 16).requires_grad_(), randn(rng, 1, 1, 20, 16)
    mask, bm, allowed, *_ = build(ex, window(12), 20, 29, 16, 16)
    o = call(ex.block_sparse_attention, q, k, v, bm, mask)
    call(o.backward, do)
    o_ref, grads_ref = attention_grads(q.detach(), k.detach(), v.detach(), do, keep=allowed)
    what = "block_sparse_attention(q starting 4 bytes into its buffer, k rows 68 bytes apart, sliding_window(12))"
    check_outputs(what, zip(("o", "dq", "dk", "dv"), "qqkv", (q, q, k, v), (o.detach(), q.grad, k.grad, v.grad),
                            (o_ref, *grads_ref), (None,) * 4), tolerance(q.dtype, BACKWARD_TOL),
                  "read each input as it is laid out")


@pytest.mark.parametrize("D", [24, 40])
def test_head_dim_not_a_power_of_two(ex, rng, D):
    """Gradients of the padded columns returned, or the padded width's 1/sqrt scale used."""
    check(ex, rng, causal(), *qkv_do(rng, 1, 1, 35, 30, D), 16, 16,
          convention="scale defaults to 1/sqrt(D) for the caller's D")


def test_explicit_scale(ex, rng):
    """scale ignored, dQ or dK without the factor scale (or with it twice)."""
    check(ex, rng, window(9), *qkv_do(rng, 1, 1, 30, 41, 16), 16, 32, scale=0.6,
          convention="s = scale · q kᵀ; dQ = scale · dS K and dK = scale · dSᵀ Q")


@interpreted_only
def test_float16_in_the_interpreter(ex, rng):
    """P or dS left in float32 for tl.dot with float16 operands, an output stored in the wrong dtype."""
    check(ex, rng, documents(doc_ids(rng, 50, 4)), *qkv_do(rng, 1, 1, 50, 50, 16, dtype=torch.float16), 16, 32,
          convention="cast P and dS to the input dtype for tl.dot; sums stay float32")


def large_lse_inputs(rng, n, d):
    """q, k, v, do (1, 1, n, d) float16 whose scores are a row's own offset, 272 to 480, plus terms near
    1: every row's lse lies in [256, 512), where float16 steps by 1/4, while its softmax stays flat.
    The offset rides on q's last column, k's being 1: dQ's last column carries the rounding that
    float16 O puts into D = rowsum(dO ∘ O) times k's value there, so that value stays small."""
    q, k, v, do = (t * 0.5 for t in qkv_do(rng, 1, 1, n, n, d, dtype=torch.float64))
    q[..., -1] = torch.from_numpy(rng.uniform(272, 480, n)).to(q)
    k[..., -1] = 1.0
    return (t.half() for t in (q, k, v, do))


def test_lse_stays_float32_under_float16_inputs(ex, rng):
    """lse stored in the inputs' dtype: rounded by up to 1/8, and the backward's P = exp(S - lse) off
    by up to 13%. Scores are large but the softmax flat (large_lse_inputs): a peaked one makes the
    correct backward's own float16 error, through D, as large as the bug's."""
    check(ex, rng, causal(), *large_lse_inputs(rng, 48, 16), 16, 16, scale=1.0,
          convention="lse (row 0 of tiles.row_stats' (B, H, 2, n_q)) is float32 whatever the inputs' dtype, "
                      "as in 06 and 09")


@pytest.mark.parametrize("case, n, block", [(causal(), 40, 16), (window(512), 552, 64)], ids=["causal", "window"])
def test_d_stays_float32_under_float16_inputs(ex, rng, case, n, block):
    """D = rowsum(dO ∘ O) made in float16 (o * do summed in the inputs' dtype): rows whose dO ∘ O sums
    to about 1000 (large_d_inputs) get D off by up to 0.5, and dS = P ∘ (dP − D), dQ with it. On a GPU the
    sum rounds at every step of its tree; the interpreter rounds once, and still shows it here. Under
    the window only the last 40 rows have a gradient, each over 512 keys with P = 1/512 exactly:
    PyTorch's own float16 error (dP rounded, differently for each key) averages out there, while D's
    moves every key alike, so that a GPU's rule, twice PyTorch's error, sees it too."""
    q, k, v, do = large_d_inputs(rng, 1, 1, n, n, 64)
    do[..., :-40, :] = 0
    check(ex, rng, case, q, k, v, do, block, block, tol=3e-2,
          convention="D = rowsum(dO ∘ O) in float32: O and dO upcast before the product, as dQ's TODO says; "
                     "here every row's D is near 1000, where float16 steps by 1")


def test_dv_summed_in_float32_across_query_tiles(ex, rng):
    """Each query tile's Pᵀ dO rounded to the inputs' dtype before it joins dV (dv += tl.dot(...).to(...)):
    here (cancelling_dv_inputs) key 0's tile products, near ±1024, cancel to a dV near 8, and each
    rounding to float16 is off by up to 0.5."""
    check(ex, rng, causal(), *cancelling_dv_inputs(rng, 1, 1, 64, 40, 16), 32, 16,
          convention=dv_summed())


@pytest.mark.parametrize("frozen", FROZEN)
def test_gradients_of_frozen_and_trained_inputs(ex, rng, frozen):
    """The backward deciding whether a gradient is wanted from the wrong input (dV from k's
    requires_grad, say): frozen keys with trained values (or another mix) lose a gradient, or get one
    they did not ask for."""
    q, k, v, do = qkv_do(rng, 1, 1, 30, 41, 16)
    mask, bm, allowed, *_ = build(ex, window(9), 30, 41, 16, 32)
    _, expected = attention_grads(q, k, v, do, keep=allowed)
    check_frozen(lambda *t: ex.block_sparse_attention(*t, bm, mask), q, k, v, do, frozen, expected,
                 "block_sparse_attention(q (1, 1, 30, 16), k/v (1, 1, 41, 16), sliding_window(9))",
                 tolerance(q.dtype, BACKWARD_TOL), FORMULAS)


DO_LAYOUTS = {  # (B, H, n_q, D) = (1, 2, 20, 16): dO as autograd may hand it to the backward
    "rows-68-bytes-apart": lambda rng: randn(rng, 1, 2, 20, 17)[..., :16],
    "starting-4-bytes-in": lambda rng: randn(rng, 2 * 20 * 16 + 1)[1:].view(1, 2, 20, 16),
    "expanded-over-heads-and-rows": lambda rng: randn(rng, 1, 1, 1, 16).expand(1, 2, 20, 16),
    "one-value-expanded": lambda rng: randn(rng, 1).reshape(()).expand(1, 2, 20, 16),
}


@pytest.mark.parametrize("layout", DO_LAYOUTS)
def test_output_gradient_in_any_layout(ex, rng, layout):
    """dO described for the tile copies as it comes (tiles.tma_aligned left out): a TMA copy needs a
    start and strides that are multiples of 16 bytes, so a grad_output sliced from a wider tensor, or
    starting 4 bytes into its buffer, is refused; an expanded one (strides of 0, as o.sum() gives) is
    read as it is. Passed as o.backward(dO) itself: a copy would lay it out anew."""
    q, k, v = randn(rng, 1, 2, 20, 16), randn(rng, 1, 2, 29, 16), randn(rng, 1, 2, 29, 16)
    do = DO_LAYOUTS[layout](rng)
    mask, bm, allowed, *_ = build(ex, window(12), 20, 29, 16, 16)
    what = (f"block_sparse_attention(q (1, 2, 20, 16), k/v (1, 2, 29, 16), sliding_window(12)).backward(dO {layout}, "
            f"strides {do.stride()})")
    convention = "dO is laid out for its descriptor as q, k and v are: tiles.tma_aligned(dO), given, copies it if it must"
    try:
        o, grads = run(ex, q, k, v, do, bm, mask)
    except AssertionError as refused:  # TensorDescriptor's own checks of a start or a stride
        raise AssertionError(f"{what}: {refused}\n  convention: {convention}") from None
    o_ref, grads_ref = attention_grads(q, k, v, do, keep=allowed)
    check_outputs(what, zip(("o", "dq", "dk", "dv"), "qqkv", (q, q, k, v), (o, *grads), (o_ref, *grads_ref), (None,) * 4),
                  tolerance(q.dtype, BACKWARD_TOL), convention)


# ---- which tiles each kernel masks ----------------------------------------------------------------

STAGES = ("each tile of a partial block, or of a full block the array's end cuts, is masked once, through "
          "masks.tile_allowed (called as that); a tile of any other full block is not: it pays for no mask")
KERNELS = {"_sparse_fwd": ("the forward", "fwd"), "_sparse_dkdv": ("the dK, dV kernel", "dkdv"),  # kernel_tiles' names
           "_sparse_dq": ("the dQ kernel", "dq")}


def tiles_to_mask(ex, bm, partial, full, kernel):
    """(first query row, first key) of every tile `kernel` must mask once, at the interpreter's tile
    sizes: the forward and dQ own row tiles and walk the key tiles of their lists, dK, dV the reverse.
    Tiles wholly past an array's end are left out: masked or skipped, they weigh nothing."""
    n_q, n_k, block_q, block_k = bm.n_q, bm.n_k, bm.block_q, bm.block_k
    block_m, block_n = sparse_launch.kernel_tiles(bm, 16, 4)[KERNELS[kernel][1]][:2]
    cut_q = n_q // block_q if n_q % block_q else None
    cut_k = n_k // block_k if n_k % block_k else None
    want = []
    for i, j in torch.nonzero(partial | full).tolist():
        cut = i == cut_q if kernel == "_sparse_dkdv" else j == cut_k
        if partial[i, j] or cut:
            want += [(r0, c0) for r0 in range(i * block_q, min((i + 1) * block_q, n_q), block_m)
                     for c0 in range(j * block_k, min((j + 1) * block_k, n_k), block_n)]
    return want


@interpreted_only
@pytest.mark.parametrize("n_q, n_k, block_q, block_k", [(52, 40, 16, 32), (70, 45, 32, 16), (64, 48, 32, 16)])
def test_each_kernel_masks_exactly_the_tiles_that_need_it(ex, rng, monkeypatch, n_q, n_k, block_q, block_k):
    """Every tile masked (the answers come out right, but each full tile pays for a mask it does not
    need), a partial tile or a full one cut by the end left unmasked, a tile masked twice; the mask
    begun at a count of blocks where tiles are narrower than blocks; RAGGED not passed on as it is
    (True where no end cuts a block, as at 64 x 48: right answers, every masked tile paying for the
    bounds).

    masks.tile_allowed is wrapped, and each kernel's launches named (tests/triton_helpers.py,
    record_by_launch), while the interpreter runs the kernels as Python; each call is put down to its
    kernel and to the tile of rows and keys it masks. Causal over 52 x 40 in blocks of 16 x 32 has
    partial blocks, full blocks inside the arrays (query block 2, key block 0), and full blocks cut by
    the keys' end (key block 1, for query block 3) and by the queries' end (query block 3, for both key
    blocks); 70 x 45 in blocks of 32 x 16 has two query tiles of 16 a block, which dK, dV walk.
    """
    mask, bm, allowed, partial, full = build(ex, causal(), n_q, n_k, block_q, block_k)
    bm = with_garbage(bm, partial, full, rng)
    masked = record_by_launch(monkeypatch, ex, KERNELS, given_masks, "tile_allowed", reads=("rows", "keys", "RAGGED"))
    run(ex, *qkv_do(rng, 1, 1, n_q, n_k, 16), bm, mask)
    what = f"block_sparse_attention(q (1, 1, {n_q}, 16), k/v (1, 1, {n_k}, 16), causal, blocks {block_q} x {block_k})"
    ragged = given_masks.ragged(bm)
    for kernel, calls in filter(lambda item: item[1], masked.items()):  # a kernel that masks its own way: below
        passed = sorted({bool(c["RAGGED"]) for c in calls})
        assert passed == [ragged], (
            f"{what}: {KERNELS[kernel][0]} ({kernel}) called masks.tile_allowed with RAGGED = "
            f"{' and '.join(map(str, passed))}, expected {ragged}\n  convention: pass the kernel's RAGGED on to "
            f"tile_allowed as it is (masks.ragged: does an end cut a block?); False leaves the bounds out of "
            f"every masked tile")
        tiles = ((int(np.min(c["rows"])), int(np.min(c["keys"]))) for c in calls)
        got = Counter((r0, c0) for r0, c0 in tiles if r0 < n_q and c0 < n_k)
        want = Counter(tiles_to_mask(ex, bm, partial, full, kernel))
        if got == want:
            continue
        r0, c0 = min((got - want) + (want - got))
        i, j = r0 // block_q, c0 // block_k
        kind = "partial" if partial[i, j] else "full" if full[i, j] else "empty"
        raise AssertionError(f"{what}: {KERNELS[kernel][0]} ({kernel}) masked the tile at query row {r0}, key "
                             f"{c0} {got[(r0, c0)]} time(s), expected {want[(r0, c0)]}: it lies in block ({i}, {j}), "
                             f"{kind}\n  convention: {STAGES}; {WALK}")
    observed("13's stages (each kernel masks exactly the tiles that need it)",
             {f"masks.tile_allowed in {KERNELS[k][0]} ({k})": calls for k, calls in masked.items()})


@interpreted_only
def test_every_kernel_compiles_for_ampere_and_hopper(ex, rng):
    """A module global read inside @triton.jit, tl.dot of float32 P by float16 dO, a mask mod the
    compiler refuses: the interpreter runs them, a GPU refuses. The kernels compile with the
    document mask, at a size where RAGGED is False (tile_allowed without its bounds, as GPU runs mostly
    are; each kernel's first launch goes on to GPU IR) and at a ragged one; the window's mod compiles
    inside block_mask's small kernel, which runs it too."""
    runs = []
    for n_q, n_k in ((32, 32), (17, 20)):
        inputs = tuple(qkv_do(rng, 1, 1, n_q, n_k, 40, dtype=torch.float16))
        mask, bm, *_ = build(ex, documents(doc_ids(rng, n_k, 3)), n_q, n_k, 16, 16)
        runs.append(partial(run, ex, *inputs, bm, mask))
    check_compiles_for_gpus(*runs, lambda: ex.block_mask(ex.sliding_window(7), 17, 20, 16, 16))


# ---- what the wrapper refuses (given) ------------------------------------------------------------

def bad_inputs(ex):
    """WRAPPER_BAD_INPUTS' cases with a block mask built for their q (n_q = 5) and k (n_k = 7)."""
    bm = ex.block_mask(ex.causal, 5, 7, 16, 16)
    cases = {case: (lambda q, k, make=make: dict(make(q, k), block_mask=bm, mask=ex.causal), words)
             for case, (make, words) in WRAPPER_BAD_INPUTS.items()}
    cases["mask-for-other-sizes"] = (lambda q, k: dict(q=q, k=k, v=k, block_mask=ex.block_mask(ex.causal, 5, 9, 16, 16),
                                                       mask=ex.causal), "built for")
    cases["not-a-mask"] = (lambda q, k: dict(q=q, k=k, v=k, block_mask=bm, mask=lambda q_idx, kv_idx: kv_idx <= q_idx),
                           "Mask")
    cases["mask-without-order"] = (lambda q, k: dict(q=q, k=k, v=k, block_mask=dataclasses.replace(bm, q_order=None),
                                                     mask=ex.causal), "order")
    for case, name, change in (("count-past-the-blocks", "kv_num_blocks", lambda t: t + 5),
                               ("index-outside-the-blocks", "kv_indices", lambda t: t - 7)):
        cases[case] = (lambda q, k, name=name, change=change: dict(
            q=q, k=k, v=k, block_mask=dataclasses.replace(bm, **{name: change(getattr(bm, name))}), mask=ex.causal), name)
    return cases


CHECKED_IN_THE_INTERPRETER = ("count-past-the-blocks", "index-outside-the-blocks")  # a copy to the host: not on a GPU


@pytest.mark.given
@pytest.mark.parametrize("case", [*WRAPPER_BAD_INPUTS, "mask-for-other-sizes", "not-a-mask", "mask-without-order",
                                  *CHECKED_IN_THE_INTERPRETER])
def test_bad_inputs_raise_value_error_before_launch(ex, rng, case):
    """The wrapper names the problem (shape, dtype, device, head dim, scale, a block mask built for other
    sizes or by hand, without the programs' order, a mask that is not a Mask; in the interpreter a count
    or a listed block out of range, which would read the process's memory) before any launch."""
    if case in CHECKED_IN_THE_INTERPRETER and not INTERPRETED:
        pytest.skip("the lists' counts and blocks are checked in the interpreter only")
    build_kwargs, words = bad_inputs(ex)[case]
    with pytest.raises(ValueError, match=words):
        ex.block_sparse_attention(**build_kwargs(*small_qk(rng)))


@pytest.mark.given
@interpreted_only
def test_interpreter_refuses_bfloat16(ex, rng):
    """Triton's interpreter multiplies the raw bits of bfloat16 in tl.dot (errors of 1e8): refused."""
    q, k = small_qk(rng)
    with pytest.raises(ValueError, match="bfloat16"):
        ex.block_sparse_attention(q.bfloat16(), k.bfloat16(), k.bfloat16(), ex.block_mask(ex.causal, 5, 7, 16, 16),
                                  ex.causal)


# ---- the GPU stage -------------------------------------------------------------------------------

# D = 40 runs padded to 64; D = 256 takes the slices of a block kernel_tiles gives the widest heads.
GPU_SHAPES = [(1, 2, 2048, 2048, 64), (1, 2, 3000, 4096, 128), (2, 2, 4096, 2500, 64), (1, 2, 300, 200, 40),
              (1, 2, 513, 700, 256)]
GPU_MASKS = {"causal": lambda rng, n: causal(), "window1000": lambda rng, n: window(1000),
             "documents": lambda rng, n: documents(doc_ids(rng, n, 9))}


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mask", GPU_MASKS)
@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=shape_id)
def test_gpu_compiled_matches_autograd(ex, rng, shape, dtype, mask):
    """Compiled-only bugs at real sizes (blocks of 128, tiles of 64): half-precision casts of P and dS,
    bounds of the ragged last blocks, unlisted blocks read (NaN) at the compiled tile sizes, head dims
    40 to 256."""
    B, H, n_q, n_k, D = shape
    q, k, v, do = qkv_do(rng, B, H, n_q, n_k, D, dtype=skip_unless_supported(dtype))
    check(ex, rng, GPU_MASKS[mask](rng, max(n_q, n_k)), q, k, v, do, 128, 128, convention=f"{FORMULAS}; {WALK}")


@gpu
@pytest.mark.gpu
def test_gpu_training_matches_sdpa(ex, rng):
    """Gradients that pass the tests above but go wrong in a real model (a stride, a layout from
    .transpose, many steps of float16): 100 steps of a 2-layer model under sliding_window(48),
    trained with your kernel and with torch's SDPA, give the same loss at every step."""
    seq, w = TRAIN["seq"], 48
    mask = ex.sliding_window(w)
    bm = ex.block_mask(mask, seq, seq, 128, 128)
    allowed = window(w).pairs(seq, seq)
    check_training(rng, lambda q, k, v: ex.block_sparse_attention(q, k, v, bm, mask),
                   lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed),
                   f"model under sliding_window({w})", "the gradients of block_sparse_attention are those of "
                   "softmax(scale q kᵀ, masked) v, SDPA given the same mask as a boolean attn_mask")


# ---- float32 on a GPU: in full unless torch was asked for TF32 ------------------------------------

GYM_MASKS = {"causal": lambda rng, n: causal(), "window64": lambda rng, n: window(64),
             "documents": lambda rng, n: documents(doc_ids(rng, n, 4))}


@gpu
@pytest.mark.gpu
@pytest.mark.usefixtures("torch_default_float32")
@pytest.mark.parametrize("mask", GYM_MASKS)
def test_gpu_float32_in_full_at_attention_gym_sizes(ex, rng, mask):
    """attention-gym's float32 test (allclose 1e-5 / 1e-4 against FlexAttention, forward and gradients)
    at its sizes, with blocks of 128: failed by 2.9e-3 with float32 multiplied in TF32 (tl.dot's own
    default) where torch computes it in full; IEEE products err by about 6e-7."""
    B, H, n, D = GYM_SHAPE
    check(ex, rng, GYM_MASKS[mask](rng, n), *qkv_do(rng, B, H, n, n, D), 128, 128,
          convention=f"{FORMULAS}; {FLOAT32}")
