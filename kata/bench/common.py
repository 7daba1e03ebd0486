"""What the benchmarks share: the GPU check, the guard around each column, timing (a column checked,
then timed, alone or with its backward), peak memory, the plot's import, and attention written in
PyTorch (standard attention, a column itself, and the float64 oracle of the tests)."""
from __future__ import annotations

import math
from pathlib import Path

from kata.exercises import find, load
from kata.gpu import NO_GPU, bf16_missing, gpu_skip_reason, use_triton_mode
from kata.unfinished import error_chain, mentions_not_implemented

# How torch says that it has no kernel for these inputs on this machine: SDPA held to one backend
# (sdpa_kernel) that refuses them reports "No available kernel" from the CUDA dispatcher and "No
# viable backend" from the CPU's; cuDNN attention that finds no execution plan for these shapes on
# this GPU reports "cuDNN Frontend error". Every other RuntimeError (a shape mismatch, an illegal
# memory access) is a bug, and is raised.
NO_KERNEL_HERE = ("No available kernel", "No viable backend", "cuDNN Frontend error")
# How torch.compile says that its backend (Inductor, and the Triton code it generates) failed for
# this GPU or this torch: FlexAttention's column. Named, not imported: torch._dynamo and
# torch._inductor are private and slow to load, and an error of theirs means they are loaded. Dynamo's
# own errors (tracing a mask_mod that has a bug) are bugs, and are raised.
COMPILE_FAILED = ("BackendCompilerFailed", "InductorError")
BACKWARD_FLOPS = 2.5  # the backward's five matmuls (S again, dV, dP, dQ, dK) to the forward's two


class ColumnError(Exception):
    """A bug in one column of a benchmark, raised from the error itself: the benchmark stops on it.

    An error of its own type, because the grader reads some (a KeyError is a LookupError) as the
    learner's mistake on its command line."""

    def __init__(self, column: str, err: BaseException):
        super().__init__(f"column {column!r} failed: {type(err).__name__}: {err}")


def gpu_torch(tested_by: str, bf16: bool = True):
    """torch when a CUDA GPU (with bfloat16, if `bf16`) is usable, else None, having said why nothing
    was measured; `tested_by` is the grader command that still tests the kernels on the CPU."""
    try:
        import torch
        use_triton_mode(torch)  # before Triton loads: on a GPU the kernels run compiled, whatever the shell exported
        import triton  # noqa: F401
    except ImportError as err:
        print(f"The benchmark needs torch and Triton ({err}); nothing was measured.")
        return None
    if not torch.cuda.is_available():
        why = gpu_skip_reason(torch)
        print("The benchmark needs a CUDA GPU, and none is usable here; nothing was measured.\n"
              + ("" if why == NO_GPU else why + "\n")
              + f"Your kernels' correctness is still tested on the CPU: {tested_by}")
        return None
    if bf16 and (why := bf16_missing(torch)):
        print(f"Every cell of the benchmark is bfloat16, so all are skipped: {why}. Nothing was measured.")
        return None
    return torch


def median_ms(fn, warmup: int = 25, rep: int = 100, grad_to_none=None) -> float:
    """Median time of fn() in ms over `rep` ms of calls, after `warmup` ms of them; the tensors in
    `grad_to_none` lose their .grad before each call, so that a backward does not accumulate."""
    from triton.testing import do_bench
    return do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none, return_mode="median")


def peak_mib(torch, fn) -> float:
    """Peak CUDA memory during one fn(), MiB, what was allocated before it (the inputs) included."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**20


def max_error(out, expected) -> float:
    """The largest absolute difference, in float32 whatever the dtypes."""
    return (out.float() - expected.float()).abs().max().item()


def cannot_run_here(torch, err: BaseException) -> str | None:
    """The table's note when `err` says that a column cannot run on this machine, or None: a bug.

    A full GPU or SRAM counts also when torch.compile wraps it (an autotuning kernel that does not fit)."""
    try:
        from triton.runtime.errors import OutOfResources
    except ImportError:  # no Triton: no kernel of its can have run out of SRAM
        OutOfResources = ()
    chain = error_chain(err)
    compiling = [e for e in chain if type(e).__name__ in COMPILE_FAILED and type(e).__module__.startswith("torch.")]
    for e in compiling:  # what the backend raised, also where torch kept it aside rather than chained
        chain += [inner for inner in error_chain(getattr(e, "inner_exception", None)) if inner not in chain]
    if mentions_not_implemented(err):
        return "not started"  # the learner's kernel, unfinished: a state, not a bug
    if any(isinstance(e, torch.cuda.OutOfMemoryError) for e in chain):
        return "OOM"
    if any(isinstance(e, OutOfResources) for e in chain):  # tiles that need more shared memory than this GPU has
        return "no room in SRAM"
    if isinstance(err, RuntimeError) and any(words in str(err) for words in NO_KERNEL_HERE):
        return "no kernel here"
    if compiling:
        return f"did not compile ({type(chain[-1]).__name__})"  # the innermost error says why
    return None


def guarded(torch, column: str, timed) -> dict:
    """timed()'s numbers, or {'note'} saying why `column` cannot run here.

    Any other error raises a ColumnError: a NameError, TypeError, AttributeError or failed import
    in a column is a bug in the kata or the learner's code, and a note in the table would hide it (a
    column lost that way looks like a backend this GPU lacks).
    """
    try:
        return timed()
    except Exception as err:
        note = cannot_run_here(torch, err)
        if note is None:
            raise ColumnError(column, err) from err
        return {"note": note}
    finally:
        torch.cuda.empty_cache()


def kernel(column: str, number: str, folder: Path, name: str):
    """Function `name` of exercise `number` in `folder`, for `column`; a file that does not load (a
    syntax error, a missing function) raises a ColumnError, as a bug in the column would."""
    return from_exercise(column, number, folder, name)[0]


def from_exercise(column: str, number: str, folder: Path, *names: str) -> tuple:
    """The objects `names` of exercise `number` in `folder`, from one load of its file, for `column`;
    a file that does not load or lacks one of them raises a ColumnError naming `column`."""
    try:
        module = load(find(number), folder)
        return tuple(getattr(module, name) for name in names)
    except Exception as err:
        raise ColumnError(column, err) from err


def checked(torch, name: str, fn, expected, flops: float) -> dict:
    """Method `name`'s fn() made ready to time: {'run': fn, 'flops', 'mib', 'err'}, or {'note'} saying
    why there is no number. fn() is checked against `expected` first (its first call also compiles it:
    never timed); expected None: a baseline that computes another function, unchecked (err None)."""
    def check():
        out = fn()
        err = None if expected is None else max_error(out, expected)
        if err is not None and not err <= 0.05:  # bf16 outputs of magnitude < 1: a bigger gap is a wrong answer
            return {"note": f"wrong ({err:.2g})"}
        del out
        return {"run": fn, "flops": flops, "mib": peak_mib(torch, fn), "err": err}
    return guarded(torch, name, check)


def checked_training(torch, name: str, fn, q, k, v, do, expected, flops: float) -> dict:
    """Method `name`'s forward + backward made ready to time, as `checked`: {'run', 'flops', 'mib',
    'err', 'leaves'} (peak over a forward + backward; err: the worst gradient's, relative to its
    largest entry; leaves: the q, k, v it differentiates), or {'note'}. `expected`: the right (dq, dk,
    dv), or None: unchecked. `flops`: the forward's; the backward counts BACKWARD_FLOPS times that."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]

    def step():
        for t in leaves:
            t.grad = None
        fn(*leaves).backward(do)

    def check():
        step()
        errors = []
        for grad, t, ref in zip(("dq", "dk", "dv"), leaves, expected or ()):
            errors.append(max_error(t.grad, ref) / max(1.0, ref.float().abs().max().item()))
            if not errors[-1] <= 0.05:  # relative to the largest gradient: bf16 rounding stays near 1e-2
                return {"note": f"wrong {grad} ({errors[-1]:.2g})"}
        return {"run": step, "flops": (1 + BACKWARD_FLOPS) * flops, "mib": peak_mib(torch, step),
                "err": max(errors) if errors else None, "leaves": leaves}
    return guarded(torch, name, check)


def timed(torch, ready: dict, rounds: int = 1) -> dict:
    """name -> {'ms', 'tflops', 'mib', 'err', 'rounds'} for each method of `ready` (name -> `checked`'s
    answer), or its {'note'}. The methods are timed in turn, `rounds` times, each round in the
    reverse order of the one before; 'rounds' holds each round's median ms, and 'ms' is the fastest.
    A slow spell of the GPU (its clocks, a neighbour on the machine) then slows one round of every
    method, where timed once each it would make one method look slower than another."""
    times = {name: [] for name, cell in ready.items() if "run" in cell}
    notes = {}
    for r in range(rounds):
        for name in (list(times) if r % 2 == 0 else list(times)[::-1]):
            if name in notes:
                continue
            got = guarded(torch, name, lambda run=ready[name]["run"]: {"ms": median_ms(run)})
            if "ms" in got:
                times[name].append(got["ms"])
            else:  # out of memory now, say: the method's note, its earlier rounds dropped
                notes[name] = got
    out = {}
    for name, cell in ready.items():
        if "run" not in cell or name in notes:
            out[name] = notes.get(name) or {"note": cell["note"]}
            continue
        ms = min(times[name])
        out[name] = {"ms": ms, "tflops": cell["flops"] / ms * 1e-9, "mib": cell["mib"], "err": cell["err"],
                     "rounds": times[name]}
    return out


def measure(torch, name: str, fn, expected, flops: float) -> dict:
    """{'ms', 'tflops', 'mib', 'err'} for method `name` in one cell, timed once, or {'note'}: `checked`."""
    return timed(torch, {name: checked(torch, name, fn, expected, flops)})[name]


def measure_training(torch, name: str, fn, q, k, v, do, expected, flops: float, backward_alone: bool = True) -> dict:
    """Method `name`'s backward and forward + backward in one cell: {'bwd_ms', 'bwd_tflops', 'ms',
    'tflops', 'mib', 'err'}, or {'note'}: `checked_training`, timed once. backward_alone=False: no
    'bwd_' numbers. Timing the backward alone replays it on one graph (retain_graph), which a
    torch.compile'd backward that donates its buffers refuses."""
    ready = checked_training(torch, name, fn, q, k, v, do, expected, flops)
    out = timed(torch, {name: ready})[name]
    if backward_alone and "ms" in out:
        leaves = ready["leaves"]

        def backward():
            o = fn(*leaves)
            bwd_ms = median_ms(lambda: o.backward(do, retain_graph=True), grad_to_none=leaves)
            return {"bwd_ms": bwd_ms, "bwd_tflops": BACKWARD_FLOPS * flops / bwd_ms * 1e-9}
        out.update(guarded(torch, name, backward))
    return out


def gradients(fn, q, k, v, do) -> list:
    """dq, dk, dv of fn(q, k, v) for the output gradient do."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    fn(*leaves).backward(do)
    return [t.grad for t in leaves]


def speedup(cells: dict, fast: str, slow: str, key: str = "ms") -> float | None:
    """How many times faster column `fast` is than `slow` in one cell ({column: result}): the time
    of slow / the time of fast; None when either has no time."""
    a, b = cells[fast], cells[slow]
    return b[key] / a[key] if key in a and key in b else None


def geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


def cell(result: dict, key: str) -> str:
    """A column's `key` in one cell as the tables print it, or the note saying why there is none."""
    return result.get("note") or f"{result[key]:.{3 if key.endswith('ms') else 0}f}"


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def default_backend(torch, q, k, v, causal: bool) -> str:
    """The backend SDPA picks for these inputs, as PyTorch's dispatcher reports it."""
    from torch.nn.attention import SDPBackend
    try:
        return SDPBackend(torch._fused_sdp_choice(q, k, v, None, 0.0, causal)).name.lower()
    except Exception:  # a private API: name it unknown rather than fail the benchmark
        return "unknown"


def pyplot():
    """matplotlib.pyplot drawing to files, or None, having said that there is no plot (it is optional)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no plot: matplotlib is not installed)")
        return None
    return plt


def repeat_kv(q, k, v):
    """k and v with each head repeated for the H_q / H_kv query heads it serves (GQA: query head h reads
    kv head h // (H_q / H_kv), as SDPA's enable_gqa), for code that has no GQA."""
    group = q.shape[1] // k.shape[1]
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def standard_attention(torch, q, k, v, causal: bool = False, dropout_p: float = 0.0):
    """softmax(q kᵀ / sqrt(d)) v as PyTorch runs it step by step, the n × n scores in HBM: matmul, mask,
    softmax, dropout where dropout_p > 0, matmul. The paper's standard attention; the forward
    benchmark's naive column. Dropout is PyTorch's own kernel: it reads P, writes the dropped P and
    keeps its mask for the backward."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).triu(1), -math.inf)
    p = torch.softmax(s, dim=-1)
    if dropout_p > 0:
        p = torch.nn.functional.dropout(p, dropout_p)
    return p @ v

