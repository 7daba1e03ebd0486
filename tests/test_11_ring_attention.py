"""Tests for exercise 11: ring attention on 1 to 4 local processes (gloo, CPU) against dense float64
attention over the whole sequence in one process.

Each ring case starts its world afresh with kata.ring.launch (a process costs milliseconds). In every
rank, kata.ring counts the numbers sent and received (isend/irecv, send/recv, batch_isend_irecv
alike) and notes whose K/V shard each local_attention call gets. A rank's error comes back as one
line naming the rank; a ring still running after a few seconds is ended and reported as hung, and
the ring tests after it fail at once. Each test's name says the bug it catches;
mutants/11_ring_attention.toml holds those bugs.
"""
import math

import numpy as np
import pytest

from checks import assert_close, assert_unmodified

torch = pytest.importorskip("torch", reason="exercise 11 needs PyTorch")
from kata.tools import ring  # noqa: E402 - only once torch is known to import
from oracles_torch import attention  # noqa: E402

WHY_NOT = ring.unavailable()
if WHY_NOT:
    pytest.skip(f"needs torch.distributed and local processes: {WHY_NOT}", allow_module_level=True)

MERGE = "merged lse = logaddexp(lse_a, lse_b); each side weighs exp(lse_side - lse)"
EMPTY = "a side with lse = -inf is the identity of the merge, whatever its o holds; two give (0, -inf)"
STEPS_CAUSAL = ("causal: rank r attends the K/V shards of ranks 0..r once each; a later rank's keys "
                "all come after r's queries, so that step is skipped (the shard is still passed on)")
STEPS_FULL = "every rank attends every K/V shard once, its own included"
OVERLAP = ("start the next shard's isend and irecv before this step's local_attention, wait for them after "
           "it: the transfer overlaps the compute")
PASSED = ("a K/V shard travels once around the ring: world - 1 transfers per rank; at the last step "
          "the held shard would only go back to its owner")
VALUES = ("equal to attention over the whole sequence: rank r's rows are positions "
          "[r·n_local, (r+1)·n_local); causal masks only the diagonal step (the rank's own shard)")
MATCHED = ("each step, every rank sends to send_to and receives from recv_from, the same number of "
           "tensors of the same shapes; every isend/irecv request is waited before its buffer is used")
CARRIED = ("o and lse are carried in float32 across the ring and cast to the inputs' dtype once at the end: "
           "in bfloat16 the error against float32 attention over the whole sequence is at most twice that of "
           "PyTorch's own bfloat16 attention")
STRIDED = "shards may be any strided views; gloo sends only contiguous tensors, so a strided one is copied first"
# Slack over twice PyTorch's error, absolute: below half a bfloat16 step of o's entries (|o| ~ 0.1-1 over
# 32 random keys), so it forgives one rounding falling the other way, not a rounding per merge.
BF16_SLACK = 1e-3
HUNG = []  # the first ring that hung: the ring tests after it fail at once instead of waiting too


# ---- running a ring ---------------------------------------------------------------------------------

def run_ring(request, rng, world, shape, causal=False, scale=None, groups=None, dtype=np.float64, spread=1.0,
             bfloat16=False, transposed=False):
    """Launch `world` ranks on fresh inputs; each holds q, k, v of `shape` (B, H, n_local, D), in
    bfloat16 if asked (the inputs returned are then float32 holding the same values), as transposed
    views of (B, n_local, H, D) buffers if asked.

    Returns the label naming the case, the whole-sequence inputs and each rank's result.
    """
    __tracebackhide__ = True
    b, h, n, d = shape
    size = len(groups[0]) if groups else world
    q, k, v = (rng.standard_normal((b, h, size * n, d)).astype(dtype) for _ in range(3))
    q *= spread
    if bfloat16:
        q, k, v = (torch.from_numpy(a).bfloat16().float().numpy() for a in (q, k, v))
    notes = [f"world {world}", "causal" if causal else "", f"scale={scale}" if scale is not None else "",
             f"groups {groups}" if groups else "", f"q/k/v {shape} {'bfloat16' if bfloat16 else np.dtype(dtype)} "
             f"per rank", "each a .transpose(1, 2) view of a (B, n_local, H, D) buffer" if transposed else ""]
    label = f"ring_attention({', '.join(filter(None, notes))})"
    if HUNG:
        raise AssertionError(f"{label}: not run, because {HUNG[0]} hung: fix that first")
    try:
        results = ring.launch(world, ring.ring_rank, str(request.config.kata_target), q, k, v, causal, scale, groups,
                              "bfloat16" if bfloat16 else None, transposed)
    except ring.RingHung as error:
        HUNG.append(label)
        raise AssertionError(f"{label}: {error}\n  convention: {MATCHED}") from None
    except ring.RingError as error:
        raise AssertionError(f"{label}: {error}") from None
    return label, (q, k, v), results


def check_passing(label, results, causal):
    """Inputs untouched, the right shards attended once each, world - 1 shards sent and received."""
    __tracebackhide__ = True
    for rank, r in enumerate(results):
        assert not r["modified"], (f"{label}: rank {rank}: {', '.join(r['modified'])} was modified in place\n"
                                   f"  convention: inputs are never modified (receive into new buffers)")
    for rank, r in enumerate(results):
        expected = list(range(r["ring_rank"] + 1 if causal else r["ring_size"]))
        assert sorted(r["steps"]) == expected, (
            f"{label}: rank {rank}: local_attention got the K/V shards of ranks {r['steps']}, expected each of "
            f"{expected} once{' (-1: keys of no rank)' * (-1 in r['steps'])}"
            f"\n  convention: {STEPS_CAUSAL if causal else STEPS_FULL}")
    for rank, r in enumerate(results):
        for what in ("sent", "received"):
            shards, expected = r[what] / r["shard"], r["ring_size"] - 1
            assert shards == expected, (f"{label}: rank {rank} {what} {shards:g} K/V shards ({r[what]} numbers), "
                                        f"expected {expected}\n  convention: {PASSED}")


def check_overlap(label, results):
    """While each step attends its shard, the next shard's isend and irecv are in flight (started,
    not yet waited for); only the last attended step has nothing left to pass on."""
    __tracebackhide__ = True
    for rank, r in enumerate(results):
        if r["ring_size"] == 1:
            continue
        for number, (shard, flying) in enumerate(zip(r["steps"][:-1], r["in_flight"][:-1])):
            if not ("isend" in flying and "irecv" in flying):
                raise AssertionError(
                    f"{label}: rank {rank}: while local_attention ran on the keys of rank {shard} (its attended "
                    f"step {number}), the transfers in flight were {flying or 'none'}: the next K/V shard was not "
                    f"travelling during the compute\n  convention: {OVERLAP}")


def check_values(label, inputs, results, causal, scale=None, tol=1e-10, dtype=None, convention=VALUES):
    """Each rank's o and lse against its rows of dense attention over the whole sequence (float64).

    `tol` is rtol = atol, or {"o": atol, "lse": atol}; `dtype` is the torch dtype's name the results
    must have (default: the inputs').
    """
    __tracebackhide__ = True
    o_ref, lse_ref = (t.numpy() for t in attention(*inputs, causal=causal, scale=scale))
    dtype = dtype or str(inputs[0].dtype)
    rtol, atol = (0.0, tol) if isinstance(tol, dict) else (tol, {"o": tol, "lse": tol})
    for rank, r in enumerate(results):
        n = o_ref.shape[2] // r["ring_size"]
        first = r["ring_rank"] * n
        rows = slice(first, first + n)
        where = f"{label}: rank {rank}, positions {first}-{first + n - 1}"
        outputs = (("o", r["o"], o_ref[:, :, rows]), ("lse", r["lse"], lse_ref[:, :, rows]))
        for name, got, _ in outputs:
            assert isinstance(got, np.ndarray), f"{where}: {name} must be a torch tensor, got a {got}"
        assert r["dtypes"] == [dtype, dtype], (f"{where}: o and lse must be {dtype}, got {' and '.join(r['dtypes'])}"
                                               f"\n  convention: {dtype} in gives {dtype} out")
        for name, got, expected in outputs:
            assert_close(got, expected, what=f"{where}: {name} (row = batch, head, query)", convention=convention,
                         rtol=rtol, atol=atol[name])


CASES = [(1, (2, 3, 5, 4)), (2, (1, 2, 3, 5)), (3, (2, 1, 4, 3)), (4, (1, 2, 2, 6))]


def case_id(case):
    world, (b, h, n, d) = case
    return f"world{world}-b{b}-h{h}-nlocal{n}-d{d}"


# ---- merge_partials, in this process ----------------------------------------------------------------

def test_merge_worked_example(ex):
    """The lesson's numbers: sides [1] at lse 0 and [5] at lse log 3 merge to [4] at lse log 4."""
    one = lambda x: torch.tensor(x, dtype=torch.float64).reshape(1, 1, 1, -1)  # noqa: E731
    o, lse = ex.merge_partials(one([1.0]), one([0.0])[..., 0], one([5.0]), one([math.log(3)])[..., 0])
    what = "merge_partials(o_a [1], lse_a 0, o_b [5], lse_b log 3)"
    assert_close(torch.as_tensor(o).numpy(), [[[[4.0]]]], what=what + " -> o", convention=MERGE)
    assert_close(torch.as_tensor(lse).numpy(), [[[math.log(4)]]], what=what + " -> lse", convention=MERGE)


def test_merge_empty_side_adds_nothing_even_if_its_o_is_nan(ex, rng):
    """0 · NaN = NaN from an empty side's o, or -inf - (-inf) = NaN when both sides are empty."""
    shape = (2, 3, 6, 4)
    o_a, o_b = (torch.from_numpy(rng.standard_normal(shape)) for _ in range(2))
    lse_a, lse_b = (torch.from_numpy(rng.standard_normal(shape[:-1])) for _ in range(2))
    lse_a[:, :, [0, 2]] = -math.inf  # rows 0 and 2: side a empty; rows 1 and 2: side b empty
    lse_b[:, :, [1, 2]] = -math.inf
    o_a[:, :, [0, 2]] = math.nan
    o_b[:, :, [1, 2]] = math.nan
    w_a, w_b = torch.sigmoid(lse_a - lse_b), torch.sigmoid(lse_b - lse_a)  # each side's share of the union
    o_exp = torch.where(torch.isneginf(lse_a), 0, w_a)[..., None] * torch.nan_to_num(o_a) + \
        torch.where(torch.isneginf(lse_b), 0, w_b)[..., None] * torch.nan_to_num(o_b)
    o_exp[:, :, 0], o_exp[:, :, 1], o_exp[:, :, 2] = o_b[:, :, 0], o_a[:, :, 1], 0.0
    inputs = [o_a, lse_a, o_b, lse_b]
    before = [t.clone() for t in inputs]
    o, lse = ex.merge_partials(*inputs)
    for name, t, t0 in zip(["o_a", "lse_a", "o_b", "lse_b"], inputs, before):
        assert_unmodified(t0.numpy(), t.numpy(), name)
    what = "merge_partials(o (2, 3, 6, 4) float64; rows 0 and 2 of side a and 1 and 2 of side b empty, o NaN)"
    assert_close(torch.as_tensor(o).numpy(), o_exp.numpy(), what=what + " -> o", convention=EMPTY, dtype=np.float64)
    assert_close(torch.as_tensor(lse).numpy(), torch.logaddexp(lse_a, lse_b).numpy(), what=what + " -> lse",
                 convention=EMPTY, dtype=np.float64)


# ---- the ring ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_each_shard_goes_once_around_and_the_merge_is_exact(ex, request, rng, case, causal):
    """A shard attended twice or never, a causal step not skipped (or the diagonal skipped), a shard
    sent back to its owner (world transfers instead of world - 1), a receive into the input k or v,
    or into the buffer being sent or attended (from world 3 on, a rank then attends one shard twice);
    then a wrong merge, the diagonal step unmasked or a past shard masked, lse not the natural log."""
    world, shape = case
    label, inputs, results = run_ring(request, rng, world, shape, causal)
    check_passing(label, results, causal)
    check_values(label, inputs, results, causal)


@pytest.mark.parametrize("world, causal", [(3, False), (4, True)], ids=["world3-full", "world4-causal"])
def test_the_next_transfer_overlaps_this_steps_compute(ex, request, rng, world, causal):
    """The transfer started after the step's compute, or blocking send and recv after it: right
    numbers, but each step then waits for its shard instead of receiving it while it computes."""
    label, _, results = run_ring(request, rng, world, (1, 2, 2 * world, 4), causal)
    check_overlap(label, results)


def test_huge_scores_merge_without_overflow(ex, request, rng):
    """A merge that exponentiates lse itself (exp(700) = inf) instead of lse differences."""
    label, inputs, results = run_ring(request, rng, 3, (1, 2, 3, 4), causal=True, spread=1000.0)
    check_values(label, inputs, results, causal=True)


@pytest.mark.parametrize("scale", [0.0, 0.37])
def test_scale_reaches_every_step(ex, request, rng, scale):
    """scale not passed on to local_attention, or 1/sqrt(D) used whenever scale is falsy (0.0 is a scale)."""
    label, inputs, results = run_ring(request, rng, 2, (1, 2, 3, 4), causal=True, scale=scale)
    check_values(label, inputs, results, causal=True, scale=scale)


def test_float32_in_float32_out(ex, request, rng):
    """o or lse built in float64 (torch's default for a Python float) from float32 inputs."""
    label, inputs, results = run_ring(request, rng, 2, (2, 1, 3, 4), dtype=np.float32)
    check_values(label, inputs, results, causal=False, tol=1e-5)


def test_ring_of_a_subgroup_stays_in_its_group(ex, request, rng):
    """The group not passed on: rank, world and neighbours taken from the whole world, not the ring
    (ring_neighbours(group) gives them), or ring ranks passed where isend, irecv and P2POp take global ones."""
    label, inputs, results = run_ring(request, rng, 4, (1, 2, 2, 3), causal=True, groups=[[0, 2], [1, 3]])
    check_passing(label, results, causal=True)
    check_values(label, inputs, results, causal=True)


def test_strided_shards_are_sent_contiguous(ex, request, rng):
    """Shards as a model passes them, x.view(B, n, H, D).transpose(1, 2): a ring that sends the held view
    as it is (gloo: "input tensor has to be contiguous"), or receives into buffers shaped like it."""
    label, inputs, results = run_ring(request, rng, 3, (2, 3, 4, 5), causal=True, transposed=True)
    check_passing(label, results, causal=True)
    check_values(label, inputs, results, causal=True, convention=f"{VALUES}; {STRIDED}")


@pytest.mark.parametrize("world", [2, 3, 4])
def test_bfloat16_is_as_accurate_as_pytorchs_own(ex, request, rng, world):
    """o and lse carried in bfloat16: each step's o normalised by a rounded lse and each merge rounded
    again, so the ring's o drifts 4-13 times as far from float32 as PyTorch's bfloat16 attention."""
    label, inputs, results = run_ring(request, rng, world, (2, 2, 32, 32), dtype=np.float32, bfloat16=True)
    q, k, v = (torch.from_numpy(a).bfloat16() for a in inputs)
    o_torch = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    lse_torch = torch.logsumexp(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)  # bfloat16 throughout
    o_ref, lse_ref = attention(*inputs)
    errors = {name: (got.double() - ref).abs().max().item()
              for name, got, ref in (("o", o_torch, o_ref), ("lse", lse_torch, lse_ref))}
    check_values(label, inputs, results, causal=False, dtype="bfloat16",
                 tol={name: 2 * error + BF16_SLACK for name, error in errors.items()},
                 convention=f"{CARRIED} (its error: o {errors['o']:.3g}, lse {errors['lse']:.3g}; "
                            f"slack {BF16_SLACK:g})")
