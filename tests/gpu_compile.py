"""Compile the kernels a test launched in Triton's interpreter for real GPUs, without one.

The interpreter runs a @triton.jit function as Python, so it accepts code that compiled Triton
refuses: a module global read inside the kernel, `tl.dot` of float16 by float32. Such a kernel
passes every CPU test, then fails on the rented GPU. `record_launches()` notes each launch the
interpreter runs (the kernel, its argument types, its constexprs); `compile_for_gpus` compiles
each one for Ampere (sm_80) and Hopper (sm_90) in the launch's dtype, except that a float16 launch
is compiled in float16 for Ampere, in bfloat16 (which the interpreter cannot run) for Hopper, and
in float32 for Ampere: each target and each dtype the GPU stage runs, at least once. Each goes as
far as Triton IR (ttir), where a global or a dtype is refused; each kernel's first launch in
bfloat16 on Hopper goes on to GPU IR (ttgir), where the target's own passes run; machine code is
left to the GPU stage. Compiling needs no GPU, but a process without TRITON_INTERPRET: it runs in a
child process, `python tests/gpu_compile.py`, and its verdicts are cached by content.

It also checks how float32 is multiplied, which the interpreter cannot show (it multiplies in full
float32 whatever tl.dot is told): under torch's default setting every tl.dot of float32 in the IR
must be IEEE, as torch's matmuls are, not TF32 (Triton's default). Where the test asked torch for
TF32 (kata/given/precision.py), TF32 passes, and so does IEEE, slower but never less exact. Each
launch records the precision the given rule chose at that moment, so the verdict and its cache key
follow the setting the launch ran under.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import json
import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python tests/gpu_compile.py` (no fork): tests/ alone is on the path
    sys.path.insert(0, str(ROOT))

from kata.given import solved
from kata.grader.progress import STATE_DIR, write_whole
from kata.unfinished import error_chain

CACHE = STATE_DIR / "cache" / "compile"
TARGETS = {80: "Ampere (sm_80)", 90: "Hopper (sm_90)"}
POINTER_TYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "int8": "i8", "int32": "i32", "int64": "i64"}


def _arg_type(value) -> str | None:
    """Triton's signature type for a launch argument; None for a constexpr."""
    if value is None:
        return None
    if hasattr(value, "dtype") and hasattr(value, "data_ptr"):
        return "*" + POINTER_TYPES[str(value.dtype).removeprefix("torch.")]
    if hasattr(value, "base") and hasattr(value, "block_shape"):  # a host-made TensorDescriptor (13)
        return f"tensordesc<{POINTER_TYPES[str(value.base.dtype).removeprefix('torch.')]}{list(value.block_shape)}>"
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"a kernel argument of type {type(value).__name__}")


@contextlib.contextmanager
def record_launches():
    """Within the block, every interpreted launch is appended to the list this yields, with the
    tl.dot precisions of dot_precisions() as it runs (`dots`)."""
    from triton.runtime.interpreter import InterpretedFunction
    launches: list[dict] = []
    run = InterpretedFunction.run

    def recording(self, *args, grid, warmup, **kwargs):
        launches.append(dict(_launch(self.fn, args, kwargs), dots=dot_precisions()))
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = recording
    try:
        yield launches
    finally:
        InterpretedFunction.run = run


def dot_precisions() -> dict[str, str]:
    """The tl.dot input precision torch's setting gives float16 and float32 now (kata/given/precision.py):
    a launch's record, which the float32 rule of its verdict reads."""
    import torch
    from kata.given.precision import dot_precision
    return {dtype: dot_precision(getattr(torch, dtype)) for dtype in ("float16", "float32")}


def _launch(fn, args, kwargs) -> dict:
    options = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
    params = inspect.signature(fn)
    bound = params.bind(*args, **{k: v for k, v in kwargs.items() if k not in options})
    bound.apply_defaults()
    signature, constexprs = {}, {}
    for name, param in params.parameters.items():
        value = bound.arguments[name]
        kind = None if "constexpr" in str(param.annotation) else _arg_type(value)
        signature[name] = kind or "constexpr"
        if kind is None:
            constexprs[name] = _jit_ref(value) if hasattr(value, "fn") and callable(value.fn) else value
    return dict(file=inspect.getsourcefile(fn), module=fn.__module__, name=fn.__name__, signature=signature,
                constexprs=constexprs, options=options)


def _kata_code(module: str) -> bool:
    """Whether a module is the kata's own code (kata.given, a solved exercise), not the learner's."""
    return module.startswith(("kata.", solved.PREFIX))


def _jit_ref(value) -> dict:
    """A @triton.jit function passed as a constexpr (13's mask mod), by where it is defined: a
    launch is sent to the compiling process as JSON."""
    return {"jit": value.fn.__name__, "module": value.fn.__module__, "file": inspect.getsourcefile(value.fn)}


def _functions(launch: dict) -> list[dict]:
    """The @triton.jit functions a launch was passed as constexprs, as _jit_ref recorded them."""
    return [v for v in launch["constexprs"].values() if isinstance(v, dict) and "jit" in v]


def _constexpr(value):
    """A constexpr as recorded, with a @triton.jit function found again in its module."""
    if isinstance(value, dict) and "jit" in value:
        return getattr(_module(dict(module=value["module"], file=value["file"])), value["jit"])
    return value


def _variants(launch: dict) -> list[tuple[str, dict, int]]:
    """(dtype, launch, target) triples: as launched for both targets, but a float16 launch for
    Ampere only, again in bfloat16 for Hopper, and in float32 (the GPU stage's third dtype) for Ampere.
    A float16 argument is a pointer (*fp16) or a tensor descriptor (tensordesc<fp16[...]>).

    The float32 copy keeps the constexprs the wrapper chose for float16, and is judged by the float32
    rule of the launch's setting: the given rule chose "ieee" for float16, which is float32's too under
    torch's default, and where TF32 was asked for either passes. So a kernel, or a wrapper, that
    passes TF32 whatever the dtype fails on the copy as it would on a float32 launch."""
    halves = [name for name, kind in launch["signature"].items() if kind == "*fp16" or kind.startswith("tensordesc<fp16")]
    types = set(launch["signature"].values())
    singles = any(kind == "*fp32" or kind.startswith("tensordesc<fp32") for kind in types)
    dtype = "float16" if halves else "float32" if singles else "integer"
    if dtype != "float16":
        return [(dtype, launch, cap) for cap in TARGETS]

    def recast(element: str) -> dict:
        return dict(launch, signature={k: v.replace("fp16", element) if k in halves else v
                                       for k, v in launch["signature"].items()})
    return [(dtype, launch, 80), ("bfloat16", recast("bf16"), 90), ("float32", recast("fp32"), 80)]


def _key(job: dict, given: bytes) -> str:
    """The verdict's key: the job, the files of the kernel and of the functions it was passed, and
    `given`, the digest of what it may call into."""
    files = [job["launch"]["file"], *(f["file"] for f in _functions(job["launch"]))]
    text = json.dumps(job, sort_keys=True).encode() + b"".join(Path(f).read_bytes() for f in files) + given
    return hashlib.sha256(text).hexdigest()


def _given_digest() -> bytes:
    """The given library's sources, Triton's version and this check's own source: a kernel calls into
    the first, compiled by the second, judged by the third; and what the compiling process inherits
    that changes how Triton compiles (Python, whose ast it parses; the TRITON_ variables, such as
    TRITON_F32_DEFAULT, tl.dot's default precision)."""
    import triton
    digest = hashlib.sha256(triton.__version__.encode() + Path(__file__).read_bytes() + sys.version.encode())
    for name in sorted(n for n in os.environ if n.startswith("TRITON_") and n != "TRITON_INTERPRET"):
        digest.update(f"{name}={os.environ[name]}".encode() + b"\0")
    for path in sorted((ROOT / "kata" / "given").glob("*.py")):
        digest.update(path.read_bytes())
    return digest.digest()


def compile_for_gpus(launches: list[dict]) -> list[str]:
    """What compiled Triton refuses among `launches`: one line per kernel and reason, naming the
    targets and dtypes it fails for."""
    # A kernel of the kata's own (kata.given, or a solved exercise) is not the learner's code: its own
    # check compiles it, unless it runs a function of the learner's (13's block mask runs their mask mod).
    ours = [launch for launch in launches if not _kata_code(launch["module"])
            or any(not _kata_code(f["module"]) for f in _functions(launch))]
    jobs = {json.dumps(dict(launch=variant, dtype=dtype, target=cap), sort_keys=True): None
            for launch in ours for dtype, variant, cap in _variants(launch)}
    jobs = [json.loads(j) for j in jobs]
    # ttgir costs five times ttir: once per kernel (its first launch), in bfloat16 on Hopper, whose
    # passes do the most; every other job stops at ttir, where a global or a dtype is refused.
    deep = set()
    for job in jobs:
        name = (job["launch"]["module"], job["launch"]["name"])
        job["ttgir"] = (job["target"], job["dtype"]) == (90, "bfloat16") and name not in deep
        if job["ttgir"]:
            deep.add(name)
    given = _given_digest()
    keys = [_key(job, given) for job in jobs]
    verdicts = {key: verdict for key in keys if (verdict := _recalled(key)) is not None}
    todo = [(key, job) for key, job in zip(keys, jobs) if key not in verdicts]
    if todo:
        found = _compile_elsewhere([job for _, job in todo])
        for (key, _), verdict in zip(todo, found):
            _remember(key, verdict)
            verdicts[key] = verdict
    failing: dict[str, tuple[set, set]] = {}
    for key, job in zip(keys, jobs):
        if verdicts[key]:
            targets, dtypes = failing.setdefault(verdicts[key], (set(), set()))
            targets.add(TARGETS[job["target"]])
            dtypes.add(job["dtype"])
    return [f"{why} (on {' and '.join(sorted(t))}, in {', '.join(sorted(d))})" for why, (t, d) in failing.items()]


def _recalled(key: str) -> str | None:
    """A cached verdict, or None when there is none to read."""
    try:
        verdict = json.loads((CACHE / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    return verdict if isinstance(verdict, str) else None


def _remember(key: str, verdict: str) -> None:
    """Cache a verdict, whole or not at all (write_whole). A cache that cannot be written (a read-only
    course folder, a full disk) only means compiling again; the grader says once that it cannot."""
    with contextlib.suppress(OSError):
        write_whole(CACHE / f"{key}.json", json.dumps(verdict))


_compiler = None  # the connection to the forked compiling process, once start_compiler has run


def start_compiler() -> None:
    """Fork the process that compiles, now: before Triton loads in interpreter mode, whose patches
    of triton.language a later fork would inherit, and after torch loads, which it then shares."""
    global _compiler
    if not hasattr(os, "fork") or "triton" in sys.modules:
        return
    parent, child = multiprocessing.Pipe()
    if os.fork() == 0:
        parent.close()
        _serve(child)
    child.close()
    _compiler = parent


def _serve(connection) -> None:
    """The forked process: compile each list of jobs it is sent, until the tests' process ends."""
    # Forked before Triton loads, but with the environment of a shell that may have exported
    # TRITON_INTERPRET=1 (Triton's tutorials say to): Triton would then load interpreted here too.
    os.environ.pop("TRITON_INTERPRET", None)
    try:
        while True:
            jobs = connection.recv()
            try:
                connection.send({"verdicts": [_compile(job) for job in jobs]})
            except Exception as error:  # the check's own fault, said in the tests' process
                connection.send({"error": f"{type(error).__name__}: {error}"})
    except (EOFError, OSError):
        pass
    finally:
        os._exit(0)  # none of pytest's exit handlers: they belong to the tests' process


def _compile_elsewhere(jobs: list[dict]) -> list[str]:
    """_compile for each job in a process where Triton runs compiled: the forked one, else a new one."""
    if _compiler is not None:
        _compiler.send(jobs)
        out = _compiler.recv()
        if "error" in out:
            raise RuntimeError(f"the compile check itself failed: {out['error']}")
        return out["verdicts"]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, __file__], input=json.dumps(jobs), capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the compile check itself failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def _module(launch: dict):
    """The kernel's module, loaded as the tests load it (an exercise file) or imported (the kata's)."""
    if launch["module"] in sys.modules:
        return sys.modules[launch["module"]]
    if launch["module"].startswith("kata."):
        return importlib.import_module(launch["module"])
    spec = importlib.util.spec_from_file_location(launch["module"], launch["file"])
    module = importlib.util.module_from_spec(spec)
    sys.modules[launch["module"]] = module  # Triton looks the module up by name
    spec.loader.exec_module(module)
    return module


def _compile(job: dict) -> str:
    """'' when the launch compiles for its target, else why not, in a learner's words."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    launch = job["launch"]
    kernel = getattr(_module(launch), launch["name"])
    target = GPUTarget("cuda", job["target"], 32)
    backend = make_backend(target)
    options = backend.parse_options(dict(launch["options"]))
    constexprs = {name: _constexpr(value) for name, value in launch["constexprs"].items()}
    source = ASTSource(kernel, launch["signature"], constexprs)
    stages: dict = {}
    backend.add_stages(stages, options, source.language)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    try:
        module = source.make_ir(target, options, backend.get_codegen_implementation(options),
                                backend.get_module_map(), context)
        inexact = _inexact_dots(str(module)) if job["dtype"] == "float32" and launch["dots"]["float32"] == "ieee" else []
        for stage in ("ttir", "ttgir") if job["ttgir"] else ("ttir",):
            module = stages[stage](module, {})
    except Exception as error:
        return f"{_kernel_name(launch)}: {_explain(error, [launch['file'], *(f['file'] for f in _functions(launch))])}"
    if inexact:
        (precision, site), more = inexact[0], len(inexact) - 1
        return (f"{_kernel_name(launch)}: {site}{f' (and {more} more tl.dot)' if more else ''}: float32 multiplied in "
                f"{precision} where torch was not asked for it: pass input_precision=PRECISION to every tl.dot (float32 "
                f"in full unless the user asked torch for TF32, as torch's matmuls; tl.dot's own default is TF32)")
    return ""


DOT_TYPES = re.compile(r": tensor<[^>]*xf32> \* tensor<[^>]*xf32> ->")  # a tt.dot of float32 operands
LOC_ALIAS = re.compile(r"^(#loc\d*) = loc\((.*)\)$", re.M)


def _inexact_dots(ir: str) -> list[tuple[str, str]]:
    """(precision, site) of each tl.dot in Triton IR (MLIR text, before its passes) that multiplies
    float32 otherwise than IEEE, once per site (a helper compiled twice has its dots twice). IEEE is
    the attribute's default and goes unprinted; a site is `file:line: `source line`` from the op's
    location."""
    aliases = dict(LOC_ALIAS.findall(ir))
    found = {}
    for line in ir.splitlines():
        if " tt.dot " not in line or not DOT_TYPES.search(line):
            continue
        precision = re.search(r"inputPrecision = (\w+)", line)
        if precision and precision.group(1) != "ieee":
            loc = re.search(r"loc\((.*)\)\s*$", line)
            found.setdefault(_site(loc.group(1) if loc else "", aliases), precision.group(1).upper().replace("X", "x"))
    return [(precision, site) for site, precision in found.items()]


def _site(loc: str, aliases: dict[str, str]) -> str:
    """`file:line: `source line`` of an MLIR location: an alias (#loc7), a name ("s"(#loc3)), a call
    site (the callee's), or "file":line:column."""
    for _ in range(len(aliases) + 1):
        if loc in aliases:
            loc = aliases[loc]
        elif found := re.match(r'(?:"[^"]*"\(|callsite\()(#loc\d*)', loc):
            loc = found.group(1)
        else:
            break
    if not (found := re.match(r'"([^"]+)":(\d+):\d+', loc)):
        return "a tl.dot"
    path, lineno = Path(found.group(1)), int(found.group(2))
    try:
        text = path.read_text(encoding="utf-8").splitlines()[lineno - 1].strip()
    except (OSError, IndexError):
        text = "tl.dot"
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return f"{where}:{lineno}: `{text}`"


def _kernel_name(launch: dict) -> str:
    """The kernel as a learner knows it: a kata kernel that runs their function (13's block mask
    runs their mask mod) is named by that function."""
    if not _kata_code(launch["module"]):
        return launch["name"]
    theirs = ", ".join(f["jit"] for f in _functions(launch) if not _kata_code(f["module"]))
    return f"{theirs} (run by the kata's kernel {launch['name']})"


def _explain(error: Exception, paths: list[str]) -> str:
    """Where and why, from the innermost CompilationError: a kernel's error is raised again at
    each call site above it, and the first raise names the line that compiled Triton refused."""
    from triton.compiler.errors import CompilationError
    chain = error_chain(error)
    inner = next((e for e in reversed(chain) if isinstance(e, CompilationError) and e.src), None)
    complaint = str(next((e for e in reversed(chain) if not isinstance(e, CompilationError)), chain[-1]))
    if inner is not None and inner.error_message:
        complaint = inner.error_message
    complaint = complaint.strip().splitlines()[-1] if complaint.strip() else type(error).__name__
    if (name := re.search(r"Cannot access global variable (\w+)", complaint)):
        complaint = (f"the kernel reads the module global {name.group(1)}, which compiled Triton refuses; "
                     f"write the number itself, or pass it in as an argument")
    if inner is None or not hasattr(inner.node, "lineno"):
        return complaint
    line = inner.src.split("\n")[inner.node.lineno - 1].strip()
    return f"{_where(inner.src, inner.node.lineno, paths)}: `{line}`: {complaint}"


def _where(src: str, lineno: int, paths: list[str]) -> str:
    """file:line of line `lineno` of the function whose source is `src`, in `paths` (the kernel's
    file, those of the functions it was passed) or the given library it calls into."""
    for candidate in [*map(Path, paths), *sorted((ROOT / "kata" / "given").glob("*.py"))]:
        text = candidate.read_text(encoding="utf-8")
        if (at := text.find(src.split("\n")[0])) >= 0:
            rel = candidate.relative_to(ROOT) if candidate.is_relative_to(ROOT) else candidate
            return f"{rel}:{text.count(chr(10), 0, at) + lineno}"
    return f"line {lineno} of the kernel"


def main() -> None:
    print(json.dumps([_compile(job) for job in json.loads(sys.stdin.read())]))


if __name__ == "__main__":
    main()
