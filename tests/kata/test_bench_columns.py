"""Every column of every benchmark run at a tiny size and checked against the float64 oracle, and
the guard that lets only "this cannot run here" become a note in a table.

The benchmarks time on a GPU, so a column that fails on every input (a NameError in standard
attention) fails only there, or vanishes into a note. Here each column's attention function runs on
the machine the tests run on: without a GPU on CPU tensors, the Triton kernels in Triton's
interpreter.
"""
import re
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from triton_helpers import DEVICE, INTERPRETED, LOG_OF_ZERO_WANTED  # noqa: E402  sets TRITON_INTERPRET before Triton loads
from triton.runtime.errors import OutOfResources  # noqa: E402
from oracles_torch import attention, attention_grads  # noqa: E402

from kata.bench import common, decode, forward, main as bench_main, paper, sparse  # noqa: E402
from kata.exercises import SOLUTIONS_DIR, find, numbers_where  # noqa: E402
from kata.given.solved import solved  # noqa: E402
from kata.tools import io_report  # noqa: E402

# float32 inputs. Compiled, the kernels multiply float32 in full unless torch is asked for TF32
# (kata/given/precision.py); the GPU's bound stays wide enough for TF32, which a user's setting may ask for.
TOL = 1e-4 if INTERPRETED else 1e-2
# SDPA held to one backend may have no kernel for float32 inputs here: cuDNN attention has none on the
# CPU, flash and cuDNN take only 16-bit inputs on a GPU. Every other column must run.
MAY_HAVE_NO_KERNEL = {"sdpa flash", "sdpa cudnn"}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A learner's folder holding the solved Triton exercises, so that the 'yours' columns run too."""
    folder = tmp_path_factory.mktemp("target")
    for number in numbers_where("needs_gpu"):
        shutil.copy(SOLUTIONS_DIR / find(number).filename, folder)
    return folder


def inputs(seed, B=2, H_q=2, H_kv=2, n_q=5, n_k=7, D=16):
    """q (B, H_q, n_q, D), k and v (B, H_kv, n_k, D), float32, on the tests' device: n_q != n_k, so that
    a mask built for a square has the wrong shape."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H_q, n_q, D, generator=gen)
    k, v = (torch.randn(B, H_kv, n_k, D, generator=gen) for _ in range(2))
    return [t.to(DEVICE) for t in (q, k, v)]


def run(column, fn, *args):
    """fn(*args), or None where SDPA has no kernel for these inputs here; any other error fails the test."""
    try:
        return fn(*args)
    except Exception as err:
        if column in MAY_HAVE_NO_KERNEL and common.cannot_run_here(torch, err) == "no kernel here":
            return None
        raise AssertionError(f"column {column!r} raised {type(err).__name__}: {err}") from err


def assert_close(column, what, got, expected):
    err = (got.double() - expected).abs().max().item()
    assert err <= TOL, f"column {column!r}: {what} is {err:.3g} off the float64 oracle (tolerance {TOL:g})"


def with_gradients(fn, q, k, v, do):
    """fn's output on leaf copies of q, k, v, and their gradients after backward(do)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    out.backward(do)
    return out, [t.grad for t in leaves]


def check_training(column, fn, q, k, v, causal, mask=None, z=None):
    """fn(q, k, v) and its dq, dk, dv against the oracle's (autograd in float64), for a random output
    gradient; z multiplies the oracle's weights after the softmax (dropout's mask / (1 - p))."""
    do = torch.randn_like(q)
    got = run(column, with_gradients, fn, q, k, v, do)
    if got is None:
        return
    o, grads = attention_grads(q, k, v, do, keep=mask, causal=causal, z=z)
    for what, mine, ref in zip(("o", "dq", "dk", "dv"), [got[0], *got[1]], [o, *grads]):
        assert_close(column, what, mine, ref)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_columns_match_the_reference(target, causal):
    """`--bench`: yours (06), reference, SDPA default, flash, cuDNN, and naive attention."""
    q, k, v = inputs(seed=1)
    table = forward.methods(torch, target)
    assert set(table) == {forward.YOURS, forward.REFERENCE, "sdpa default", *MAY_HAVE_NO_KERNEL, forward.NAIVE}
    expected = attention(q, k, v, causal=causal)[0]
    for column, fn in table.items():
        out = run(column, fn, q, k, v, causal)
        if out is not None:
            assert_close(column, "o", out, expected)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_backward_columns_match_the_reference(target, causal):
    """`--bench`'s forward + backward: yours and reference are 09's kernel, differentiable."""
    q, k, v = inputs(seed=2)
    for column, fn in forward.methods(torch, target, "09").items():
        check_training(column, lambda *t, fn=fn: fn(*t, causal), q, k, v, causal)


def test_paper_columns_match_the_reference(target, monkeypatch):
    """`--bench paper`: standard attention in PyTorch and 09's kernels, causal, forward + backward; with
    dropout, standard attention through PyTorch's dropout at p = 0.1 (dropout skipped, at another p or
    before the softmax), 14's kernels under their mask at p = 0.1 and the bench's seed (a 09 kernel, or
    dropout_p not passed)."""
    q, k, v = inputs(seed=3)
    table = paper.paper_methods(torch, target)
    assert set(table) == {paper.STANDARD, "yours (09)", "reference (09)", paper.STANDARD_DROPOUT, "yours (14)",
                          "reference (14)"}
    B, H, n_q, _ = q.shape
    keep = solved("14").dropout_mask(paper.SEED, paper.DROPOUT_P, B, H, n_q, k.shape[2], device=q.device)
    assert not keep.all(), "the test's mask drops nothing: choose other sizes"
    z = keep / (1 - paper.DROPOUT_P)
    calls = []

    def dropout(weights, p):  # PyTorch's dropout, made to drop by 14's mask: one oracle serves both
        calls.append(p)
        return weights * z

    monkeypatch.setattr(torch.nn.functional, "dropout", dropout)
    for column, fn in table.items():
        calls.clear()
        dropped = column in (paper.STANDARD_DROPOUT, "yours (14)", "reference (14)")
        check_training(column, fn, q, k, v, causal=True, z=z if dropped else None)
        assert calls == ([paper.DROPOUT_P] if column == paper.STANDARD_DROPOUT else []), (column, calls)


@LOG_OF_ZERO_WANTED
@pytest.mark.parametrize("num_splits", [None, 2], ids=["splits-chosen", "splits-2"])
def test_decode_columns_match_the_reference(target, num_splits):
    """`--bench decode`: one query row, 4 query heads over 2 kv heads; 06 on K/V repeated to 4 heads."""
    q, k, v = inputs(seed=4, H_q=4, H_kv=2, n_q=1, n_k=9)
    expected = attention(q, k, v)[0]
    table, _ = decode.methods(torch, target, num_splits)
    assert set(table) == {decode.YOURS, decode.REFERENCE, decode.SDPA}
    columns = [(name, fn, (q, k, v)) for name, fn in table.items()]
    columns += [(decode.FA06, decode.expanded_06(), (q, *common.repeat_kv(q, k, v))),
                ("sdpa, K/V repeated", lambda *t: decode.sdpa_gqa(torch, *t, enable_gqa=False), (q, k, v))]
    for column, fn, args in columns:
        assert_close(column, "o", run(column, fn, *args), expected)


# `--bench sparse` at 3 x 3 tiles of 16, each mask with empty, partial and full tiles: a window of two
# tiles, and documents of 13 | 3 | 32 positions, two cut inside the first tile, the third emptying
# the tiles below the diagonal that its queries share with the other two's keys.
SPARSE_N, SPARSE_BLOCK = 48, 16
SPARSE_MASKS = {"causal": {}, "window": {"window": 32}, "documents": {"doc_ids": np.repeat([0, 1, 2], [13, 3, 32])}}


def allowed_pairs(n, window=0, doc_ids=None):
    """The mask from its definition, (n, n) bool on the tests' device: causal, a key at most window - 1
    back, the query's own document."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    allowed = j <= i
    if window:
        allowed &= j > i - window
    if doc_ids is not None:
        ids = torch.as_tensor(doc_ids)
        allowed &= ids[:, None] == ids[None, :]
    return allowed.to(DEVICE)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("mask", SPARSE_MASKS)
def test_sparse_columns_match_the_reference(target, mask):
    """`--bench sparse`: yours (13) and FlexAttention under the mask, SDPA dense causal, forward + backward.
    FlexAttention runs eagerly here (compiling it would take minutes), and has no backward on the CPU."""
    q, k, v = inputs(seed=6, B=1, H_q=1, H_kv=1, n_q=SPARSE_N, n_k=SPARSE_N)
    table = sparse.columns(torch, target, device=DEVICE, compiled=False)
    assert set(table) == {sparse.YOURS, sparse.FLEX, sparse.DENSE}
    allowed = allowed_pairs(SPARSE_N, **SPARSE_MASKS[mask])
    for column, make in table.items():
        fn = run(column, lambda: make(SPARSE_N, SPARSE_BLOCK, **SPARSE_MASKS[mask]))
        if column == sparse.DENSE:
            check_training(column, fn, q, k, v, causal=True)
        elif column == sparse.FLEX and INTERPRETED:
            expected = attention(q, k, v, keep=allowed)[0]
            assert_close(column, "o", run(column, fn, q, k, v), expected)
        else:
            check_training(column, fn, q, k, v, causal=False, mask=allowed)


@pytest.mark.parametrize("mask", SPARSE_MASKS)
def test_sparse_density_and_pairs_count_what_the_mask_keeps(mask):
    """The table's density and TFLOP/s come from each row's key interval, not from n x n arrays: they
    must equal the tiles and pairs of the mask's definition (a tile counted once per row, an interval
    one key short, a window off by one)."""
    first, last = io_report.interval_bounds(SPARSE_N, **SPARSE_MASKS[mask])
    allowed = allowed_pairs(SPARSE_N, **SPARSE_MASKS[mask]).cpu()
    assert sparse.kept_pairs(first, last) == allowed.sum().item()
    t = SPARSE_N // SPARSE_BLOCK
    tiles = allowed.reshape(t, SPARSE_BLOCK, t, SPARSE_BLOCK).any(3).any(1)
    assert sparse.density(first, last, SPARSE_BLOCK) == tiles.sum().item() / t**2


def failing_compile(backend_raises):
    """What torch.compile raises when its backend raises `backend_raises` (as Inductor raises the
    errors of the Triton it writes)."""
    def backend(graph, example_inputs):
        raise backend_raises
    try:
        torch.compile(lambda x: x + 1, backend=backend)(torch.ones(2))
    except Exception as err:
        return err
    raise AssertionError("torch.compile ran a backend that raises")


def test_flex_compile_failures_are_notes_and_its_tracing_errors_are_bugs():
    """torch.compile's backend failing (Inductor, the Triton it writes) says that this machine cannot
    run FlexAttention: a note, naming the backend's error. An error while Dynamo traces a mask_mod
    (a NameError in it, under fullgraph) is a bug in the column: it stops the benchmark."""
    notes = [common.guarded(torch, sparse.FLEX, raising(failing_compile(err)))
             for err in (RuntimeError("ptxas exited"), OutOfResources(262144, 232448, "shared memory"))]
    assert notes == [{"note": "did not compile (RuntimeError)"}, {"note": "no room in SRAM"}]

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + undefined_window  # noqa: F821  the bug

    with pytest.raises(common.ColumnError, match=r"column 'flex' failed: \w+"):  # Unsupported, in torch 2.13
        common.guarded(torch, sparse.FLEX, lambda: torch.compile(mask_mod, backend="eager", fullgraph=True)(
            0, 0, torch.arange(4), torch.arange(4)))


def raising(err):
    def timed():
        raise err
    return timed


def wrapped(outer, inner):
    """`outer` raised from `inner`, as Triton's interpreter raises a stub's NotImplementedError."""
    try:
        raise outer from inner
    except Exception as err:
        return err


def no_cudnn_attention():
    """The error torch raises for SDPA held to cuDNN attention on CPU tensors (no such backend there)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    try:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(*inputs(seed=5, n_q=7))
    except RuntimeError as err:
        return err
    raise AssertionError("SDPA ran on cuDNN attention on the CPU: pick another backend this machine lacks")


@pytest.mark.parametrize("err, note", [
    (NotImplementedError("_attn_fwd: replace this line with your code"), "not started"),
    (wrapped(RuntimeError("interpreter failed"), NotImplementedError("_attn_fwd")), "not started"),
    (RuntimeError('at 12:4:\n    raise NotImplementedError("_attn_fwd: ...")'), "not started"),
    (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 GiB"), "OOM"),
    (OutOfResources(262144, 232448, "shared memory"), "no room in SRAM"),
    (RuntimeError("No available kernel.  Aborting execution."), "no kernel here"),
    (RuntimeError("cuDNN Frontend error: [cudnn_frontend] Error: No execution plans support the graph."),
     "no kernel here"),
    (no_cudnn_attention(), "no kernel here"),
], ids=["stub", "stub-interpreted", "stub-compiled", "oom", "sram", "no-kernel", "cudnn-no-plan", "cudnn-cpu"])
def test_the_guard_notes_what_cannot_run_here(err, note):
    """A learner's unfinished kernel, a full GPU, a backend this machine lacks: a note, and the table goes on."""
    assert common.guarded(torch, "sdpa cudnn", raising(err)) == {"note": note}


def shape_mismatch():
    try:
        torch.ones(2, 3) @ torch.ones(2, 3)
    except RuntimeError as err:
        return err


@pytest.mark.parametrize("err", [
    NameError("name 'math' is not defined"), TypeError("standard_attention() missing 1 required argument"),
    AttributeError("module 'torch' has no attribute 'sofmax'"), ImportError("cannot import name 'methods'"),
    AssertionError("block sizes"), ValueError("q must be 4-D"), shape_mismatch(),
], ids=["name", "type", "attribute", "import", "assert", "value", "shape-mismatch"])
def test_the_guard_raises_a_bug_naming_its_column(err):
    """A column's bug as a note would look like a backend this GPU lacks, and its column would vanish."""
    words = re.escape(f"column '{paper.STANDARD}' failed: {type(err).__name__}")
    with pytest.raises(common.ColumnError, match=words) as raised:
        common.guarded(torch, paper.STANDARD, raising(err))
    assert raised.value.__cause__ is err


def test_the_guard_returns_the_numbers():
    assert common.guarded(torch, forward.NAIVE, lambda: {"ms": 1.5}) == {"ms": 1.5}


def scripted_times(monkeypatch, times: dict) -> list:
    """median_ms answering, for each method's run (a function returning its name), its next time from
    `times` (name -> list, a time or an error to raise); returns the order the methods were timed in."""
    order = []

    def median_ms(run):
        name = run()
        order.append(name)
        got = times[name].pop(0)
        if isinstance(got, BaseException):
            raise got
        return got
    monkeypatch.setattr(common, "median_ms", median_ms)
    return order


def ready(name: str) -> dict:
    return {"run": lambda: name, "flops": 4e9, "mib": 1.0, "err": 1e-3}


def test_methods_take_turns_and_keep_their_fastest_round(monkeypatch):
    """Timed once each, one method's slow spell reads as that method being slower; timed in one order,
    the second always follows the first's warm-up; the mean or last round would keep the spell."""
    order = scripted_times(monkeypatch, {"flex": [2.2, 2.0, 2.1], "yours": [1.9, 1.8, 2.5]})
    out = common.timed(torch, {"flex": ready("flex"), "yours": ready("yours")}, rounds=3)
    assert order == ["flex", "yours", "yours", "flex", "flex", "yours"]
    assert out["flex"] == {"ms": 2.0, "tflops": 2.0, "mib": 1.0, "err": 1e-3, "rounds": [2.2, 2.0, 2.1]}
    assert out["yours"]["ms"] == 1.8 and out["yours"]["rounds"] == [1.9, 1.8, 2.5]


def test_a_method_that_cannot_run_in_a_later_round_is_a_note_and_the_others_go_on(monkeypatch):
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 GiB")
    order = scripted_times(monkeypatch, {"flex": [2.0, oom], "yours": [1.8, 1.7, 1.9]})
    out = common.timed(torch, {"flex": ready("flex"), "yours": ready("yours"), "dense": {"note": "OOM"}}, rounds=3)
    assert order == ["flex", "yours", "yours", "flex", "yours"]
    assert out == {"flex": {"note": "OOM"}, "yours": {"ms": 1.7, "tflops": 4e9 / 1.7 * 1e-9, "mib": 1.0,
                                                     "err": 1e-3, "rounds": [1.8, 1.7, 1.9]}, "dense": {"note": "OOM"}}


def test_a_learners_file_that_does_not_load_stops_the_benchmark_naming_its_column(tmp_path):
    (tmp_path / find("06").filename).write_text("def flash_attention(q, k, v, causal=False):\n    return q +\n")
    with pytest.raises(common.ColumnError, match="column 'yours' failed: SyntaxError"):
        forward.methods(torch, tmp_path)


def test_a_column_error_exits_1_with_its_traceback_and_column(monkeypatch, capsys, tmp_path):
    """The grader prints other errors in one line, and reads a KeyError as a mistake on its command line."""
    def broken(target, argv):
        common.guarded(torch, decode.FA06, raising(KeyError("HEAD_DIM")))

    monkeypatch.setattr(decode, "main", broken)
    assert bench_main.main(tmp_path, ["decode"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "in timed\n    raise err" in err  # where the bug is
    assert err.strip().endswith(f"The benchmark stopped: column '{decode.FA06}' failed: KeyError: 'HEAD_DIM'")
