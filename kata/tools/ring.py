"""Ring attention across processes: local gloo ranks on the CPU (tests, by hand), or one GPU per rank under torchrun."""
from __future__ import annotations

import argparse
import inspect
import multiprocessing as mp
import os
import re
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import wait
from pathlib import Path

import numpy as np

from kata.exercises import find, load, resolve_target

EXERCISE = find("ring_attention")
TIMEOUT_S = 8.0  # a small ring ends in well under a second: longer means a rank waits for a message never sent


class RingError(Exception):
    """A rank failed or died; the message is one line naming it."""


class RingHung(RingError):
    """Ranks still running at the deadline (ended by then)."""


def _context():
    """Ranks start in milliseconds with torch already imported: forked from this process on Linux,
    elsewhere from a server process that imported torch once (fork is unsafe on macOS)."""
    if sys.platform.startswith("linux"):
        return mp.get_context("fork")
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed"])
    return ctx


def launch(world: int, fn, *args, timeout: float = TIMEOUT_S) -> list:
    """`fn(rank, world, *args)` in `world` local processes joined in one gloo group: the results, by rank.

    A stub's NotImplementedError comes back as itself; another error or a process that dies raises
    RingError, ranks still running after `timeout` seconds RingHung. Off Linux, `fn` must be importable.
    """
    ctx = _context()
    with tempfile.TemporaryDirectory(prefix="kata-ring-") as tmp:
        pipes = [ctx.Pipe() for _ in range(world)]
        procs = [ctx.Process(target=_rank_main, daemon=True,
                             args=(rank, world, str(Path(tmp, "store")), timeout, pipes[rank][1], fn, args))
                 for rank in range(world)]
        try:
            for proc, (_, child_end) in zip(procs, pipes):
                proc.start()
                child_end.close()  # the rank holds it now: a rank that dies reads as EOF here
            results, waiting = {}, {pipes[rank][0]: rank for rank in range(world)}
            deadline = time.monotonic() + timeout
            while waiting:
                ready = wait(list(waiting), timeout=max(0.0, deadline - time.monotonic()))
                if not ready:
                    ranks = sorted(waiting.values())
                    raise RingHung(f"rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))} still running "
                                   f"after {timeout:g} s: a receive waits for a send that never comes")
                for conn in ready:
                    rank = waiting.pop(conn)
                    try:
                        status, value = conn.recv()
                    except EOFError:
                        status, value = "error", ("died", f"the process ended (exit code {procs[rank].exitcode})")
                    if status == "error" and value[0] == "NotImplementedError":
                        raise NotImplementedError(value[1])
                    if status == "error":
                        raise RingError(f"rank {rank}: {value[0]}: {value[1]}")
                    results[rank] = value
            for conn, _ in pipes:
                conn.send("exit")  # every rank is done: now they may leave the group
            for proc in procs:
                proc.join(timeout)
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
                    proc.join()
    return [results[rank] for rank in range(world)]


def unavailable() -> str | None:
    """Why local gloo ranks cannot run here, or None when they can."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        return "this PyTorch build has no torch.distributed with the gloo backend"
    try:
        # Where ranks come from a server this starts it (torch imports there); the exercise's whole
        # test run gets 30 s, so a machine that cannot start two ranks in 20 skips with the reason.
        launch(2, _ping, timeout=20)
    except Exception as error:  # noqa: BLE001 - any reason is a reason to skip
        return f"two local gloo processes could not start ({error})"
    return None


def _ping(rank, world):
    return rank


def _rank_main(rank, world, store, timeout, conn, fn, args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # the ranks share the machine's cores
    try:
        dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                                timeout=timedelta(seconds=2 * timeout))
        conn.send(("ok", fn(rank, world, *args)))
    except BaseException as error:  # noqa: BLE001 - every failure goes back as one line
        text = re.sub(r"^\[enforce fail at [^\]]*\]\s*", "", (str(error).strip().splitlines() or [""])[0])[:240]
        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename.endswith(EXERCISE.filename)]
        if frames and not isinstance(error, NotImplementedError):
            text += f" (line {frames[-1].lineno} of {EXERCISE.filename}: {frames[-1].line})"
        conn.send(("error", (type(error).__name__, text)))
        return
    try:
        conn.recv()  # a rank that left early would cut its peers' connections
    except EOFError:
        pass
    # No destroy_process_group: every rank is done by now, and that teardown only waits on the
    # peers' own (tens of milliseconds a ring); the process's exit closes the connections.


def ring_rank(rank, world, target, q, k, v, causal=False, scale=None, groups=None, dtype=None, transposed=False,
              device="cpu") -> dict:
    """One rank's part: its shards of the whole-sequence q, k, v through the exercise's ring_attention.

    `groups` (lists of global ranks) splits the world into rings. `dtype` (a torch dtype's name, e.g.
    "bfloat16") casts the inputs to it; `transposed` gives each shard as a (B, n_local, H, D) buffer
    seen through .transpose(1, 2), as a model's projections come. Returns o and lse (NumPy, float32
    for bfloat16, which NumPy lacks; else a type name), `dtypes` (their torch dtypes), `steps` (the
    ring rank whose keys each local_attention call got), `in_flight` (for each such call, the isends
    and irecvs started and not yet waited for), the numbers sent and received, the numbers in one
    K/V shard, and which inputs came back modified.
    """
    import torch
    import torch.distributed as dist

    from torch.distributed import distributed_c10d as c10d

    counts = {"isend": 0, "irecv": 0}
    pending: dict[int, str] = {}  # the transfers started and not yet waited for: id -> "isend" or "irecv"

    class Transfer:
        """The work handle of one isend or irecv, in flight until the code waits for it."""

        def __init__(self, name, work):
            self.work = work
            pending[id(self)] = name

        def wait(self, *args, **kwargs):
            pending.pop(id(self), None)
            return self.work.wait(*args, **kwargs)

        def __getattr__(self, attribute):  # is_completed, exception, ...: the real handle's
            return getattr(self.work, attribute)

    def counting(name, op):
        def counted(tensor, *args, **kwargs):
            counts[name] += tensor.numel()
            work = op(tensor, *args, **kwargs)
            return Transfer(name, work) if work is not None else work
        return counted

    # Before the exercise loads (it may bind isend at import). send, recv and batch_isend_irecv call
    # isend and irecv through c10d's globals, and P2POp accepts only those two.
    for name in counts:
        setattr(c10d, name, counting(name, getattr(c10d, name)))
        setattr(dist, name, getattr(c10d, name))
    module = load(EXERCISE, Path(target))
    group, members = None, list(range(world))
    if groups:
        handles = [dist.new_group(g) for g in groups]  # every rank creates every group, in one order
        group, members = next((h, g) for h, g in zip(handles, groups) if rank in g)
    me, size = members.index(rank), len(members)
    cast = getattr(torch, dtype) if dtype else None
    shards = [torch.as_tensor(a).to(device, cast).chunk(size, dim=2) for a in (q, k, v)]
    mine = [s[me].transpose(1, 2).contiguous().transpose(1, 2) if transposed else s[me].clone() for s in shards]
    before = [t.clone() for t in mine]
    steps, in_flight, step = [], [], module.local_attention

    signature = inspect.signature(step)

    def counted_step(*args, **kwargs):
        k_ = signature.bind(*args, **kwargs).arguments["k"]  # however the learner passes it
        steps.append(next((s for s, shard in enumerate(shards[1]) if k_.shape == shard.shape
                           and torch.equal(k_, shard)), -1))
        in_flight.append(sorted(pending.values()))  # what travels while this step computes
        return step(*args, **kwargs)

    module.local_attention = counted_step
    out = module.ring_attention(*mine, causal=causal, scale=scale, group=group)
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(f"ring_attention returned {type(out).__name__}, expected a pair (o, lse)")
    plain = [t.detach().cpu() if isinstance(t, torch.Tensor) else t for t in out]
    o, lse = ((t.float() if t.dtype == torch.bfloat16 else t).numpy() if isinstance(t, torch.Tensor)
              else type(t).__name__ for t in plain)
    dtypes = [str(t.dtype).removeprefix("torch.") for t in plain if isinstance(t, torch.Tensor)]
    return dict(o=o, lse=lse, dtypes=dtypes, steps=steps, in_flight=in_flight, sent=counts["isend"], received=counts["irecv"],
                ring_rank=me, ring_size=size, shard=mine[1].numel() + mine[2].numel(),
                modified=[name for name, a, b in zip("qkv", before, mine) if not torch.equal(a, b)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kata.ring", description=__doc__,
                                     epilog="on GPUs: torchrun --nproc-per-node 2 -m kata.ring --solutions --causal")
    parser.add_argument("--world", type=int, default=4, help="local ranks (torchrun sets its own)")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--n-local", type=int, help="tokens per rank (default 64 locally, 4096 on GPUs)")
    parser.add_argument("--solutions", action="store_true", help="run solutions/ instead of exercises/")
    parser.add_argument("--target", metavar="DIR", help="run the exercise file in DIR")
    args = parser.parse_args(argv)
    target = str(resolve_target(args.solutions, args.target))
    torchrun = "LOCAL_RANK" in os.environ
    world = int(os.environ["WORLD_SIZE"]) if torchrun else args.world
    n = args.n_local or (4096 if torchrun else 64)
    rng = np.random.default_rng(0)  # every rank draws the same whole sequence, (B, H, world·n, D)
    q, k, v = (rng.standard_normal((1, 8, world * n, 64)).astype(np.float32 if torchrun else np.float64)
               for _ in range(3))
    if not torchrun:
        try:
            results = launch(world, ring_rank, target, q, k, v, args.causal, timeout=600)
        except (RingError, NotImplementedError) as error:
            print(f"ring_attention failed: {error}")
            return 1
        for rank, result in enumerate(results):
            print(_report(rank, result, q, k, v, args.causal, "cpu"))
        return 0
    import torch
    import torch.distributed as dist

    device = f"cuda:{os.environ['LOCAL_RANK']}" if torch.cuda.is_available() else "cpu"
    if device != "cpu":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device != "cpu" else "gloo")
    result = ring_rank(dist.get_rank(), world, target, q, k, v, args.causal, device=device)
    print(f"{dist.get_backend()} on {device}, {n} tokens a rank, float32 | "
          f"{_report(dist.get_rank(), result, q, k, v, args.causal, device)}", flush=True)
    dist.destroy_process_group()
    return 0


def _report(rank, result, q, k, v, causal, device) -> str:
    """One rank's line: the shards it attended and passed on, and how far it is from one process (float64)."""
    import torch

    q, k, v = (torch.as_tensor(t, device=device).double() for t in (q, k, v))
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=device).tril(), float("-inf"))
    n = q.shape[2] // result["ring_size"]
    rows = slice(result["ring_rank"] * n, (result["ring_rank"] + 1) * n)
    err_o = np.abs(result["o"] - (torch.softmax(s, dim=-1) @ v)[:, :, rows].cpu().numpy()).max()
    err_lse = np.abs(result["lse"] - torch.logsumexp(s, dim=-1)[:, :, rows].cpu().numpy()).max()
    overlap = [f"{len(t)} in flight" for t in result["in_flight"]]
    return (f"rank {rank}: attended the keys of ranks {result['steps']} (transfers: {', '.join(overlap)}), "
            f"sent {result['sent'] / result['shard']:g} and received {result['received'] / result['shard']:g} K/V shards; "
            f"max |o - ref| {err_o:.1e}, max |lse - ref| {err_lse:.1e}")


if __name__ == "__main__":
    raise SystemExit(main())
