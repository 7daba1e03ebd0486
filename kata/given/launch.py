"""How the Triton exercises run their kernels: compiled on a GPU or interpreted on the
CPU, on a grid of one axis, with fixed tiles for small problems and autotuned ones for large.

The grid: one program per (block of rows, batch·head), all on axis 0. CUDA's axes 1 and 2 stop at
65535 programs, and B·H passes that when many short sequences are decoded at once. Program p owns
batch·head p // cdiv(n_rows, BLOCK) and block p % cdiv(n_rows, BLOCK) of its rows.

The tiles: below TUNE_ABOVE scores a launch runs the fixed tile sizes its exercise chooses, since
autotuning compiles and times every config once per shape and that costs more than it saves on a
small problem; above it, the autotuned kernel picks the fastest config for n_q, n_k and every
constexpr argument its configs do not set (HEAD_DIM, CAUSAL, PRECISION, 14's DROPOUT): each value
of one compiles another kernel (float32 in full runs another kernel than in TF32, the forward with
a mask to draw five times the PTX instructions of one without), whose fastest tiles may differ.
Triton's interpreter always runs the fixed tiles.
"""
import inspect
import os

import triton

LOG2E = 1.4426950408889634  # the kernels compute exp(x) as exp2(x · log2 e): they take scale · LOG2E
TUNE_ABOVE = 2**25  # B·H·n_q·n_k scores
MAX_TILE = 128 * 128  # elements of a Q or K tile that fit in registers beside the float32 accumulator
# The backward's kernels (09): one holds a key block and streams query tiles past, the other the reverse.
TUNING_DKDV = [  # BLOCK_N keys stay on chip, BLOCK_M-row query tiles stream past (pipelined by num_stages)
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 128}, num_warps=4, num_stages=5),  # Triton's tutorial on Hopper
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 64}, num_warps=8, num_stages=2),  # D = 256 fits it
]
TUNING_DQ = [  # BLOCK_M query rows stay on chip, BLOCK_N-key tiles stream past
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 32}, num_warps=4, num_stages=5),  # Triton's tutorial on Hopper
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 16}, num_warps=8, num_stages=2),  # D = 256 fits it
]


def interpreted() -> bool:
    """Whether kernels run in Triton's interpreter on the CPU (TRITON_INTERPRET=1) instead of compiled."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def fitting(configs, named_args, **kwargs):
    """Keep the configs whose tiles hold at most MAX_TILE elements at this head dimension."""
    return [c for c in configs if max(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) * kwargs["HEAD_DIM"] <= MAX_TILE]


def autotuned(kernel, configs: list):
    """`kernel` tuned over `configs` once per value of tuning_key(kernel, configs), skipping those that do not fit."""
    return triton.autotune(configs, key=tuning_key(kernel, configs),
                           prune_configs_by={"early_config_prune": fitting})(kernel)


def tuning_key(kernel, configs: list) -> list[str]:
    """n_q, n_k and the kernel's constexpr arguments that no config sets: what a tuned config is kept for."""
    tiles = {name for config in configs for name in config.kwargs}
    # Read from the Python function: compiled and interpreted kernels both keep it as .fn. A constexpr's
    # annotation names constexpr, as a class or a string (Triton's own test, KernelParam.is_constexpr).
    arguments = inspect.signature(kernel.fn).parameters.values()
    return ["n_q", "n_k", *(a.name for a in arguments if "constexpr" in str(a.annotation) and a.name not in tiles)]


def launch(kernel, tuned, args: tuple, *, rows: int, block: str, batch_heads: int, scores: int, fixed: dict,
           **constexprs) -> None:
    """Run kernel(*args, **constexprs) with one program per (block of `rows`, batch·head).

    block: the tile size that cuts `rows` into blocks, "BLOCK_M" (query rows) or "BLOCK_N" (keys).
    fixed: the tile sizes, {"BLOCK_M": ..., "BLOCK_N": ...}, for small problems and the interpreter;
    `tuned` (autotuned(kernel, ...)) chooses its own for `scores` at or above TUNE_ABOVE.
    """
    if interpreted() or scores < TUNE_ABOVE:
        grid = (triton.cdiv(rows, fixed[block]) * batch_heads,)
        kernel[grid](*args, **constexprs, **fixed, num_warps=4, num_stages=2)
    else:
        tuned[lambda meta: (triton.cdiv(rows, meta[block]) * batch_heads,)](*args, **constexprs)


def backward_tiles(width: int) -> dict:
    """Untuned tiles of each backward kernel for small problems; the interpreter's 16 and 32 make
    even tiny tests span several tiles of both loops."""
    if interpreted():
        return {"dkdv": dict(BLOCK_M=16, BLOCK_N=32), "dq": dict(BLOCK_M=32, BLOCK_N=16)}
    small = width <= 128
    return {"dkdv": dict(BLOCK_M=32 if small else 16, BLOCK_N=64 if small else 32),
            "dq": dict(BLOCK_M=64 if small else 32, BLOCK_N=32 if small else 16)}
