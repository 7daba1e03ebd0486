"""A tiny Triton kernel run the way the Triton exercises' tests run it; prints one `KATA-PROBE {json}` line.

`python grader.py doctor` runs this as `python -m kata.grader.triton_probe` in a subprocess: a broken
Triton may hang or crash, and importing torch costs seconds. It lives in a file of its own because
Triton compiles a @jit function from its source file.
"""
import json


def probe() -> dict:
    """What torch sees (the GPU), how the tests run Triton here (the mode and why) and whether a
    kernel run so works; without Triton, the GPU alone and `triton_missing`, why not."""
    out = {"cuda": False, "device": None, "torch_cuda": None, "bf16_missing": None, "triton_missing": None,
           "mode": None, "why": None, "ok": False, "error": None}
    try:
        import torch
        from kata.gpu import bf16_missing, triton_missing, use_triton_mode
        out["cuda"] = torch.cuda.is_available()
        out["torch_cuda"] = torch.version.cuda  # None for a CPU build
        out["device"] = torch.cuda.get_device_name(0) if out["cuda"] else None
        out["bf16_missing"] = bf16_missing(torch) if out["cuda"] else None
        out["triton_missing"] = triton_missing()
        if out["triton_missing"]:
            return out
        mode = use_triton_mode(torch)  # as the tests decide it, before Triton loads
        out["mode"], out["why"] = mode.label, mode.why
        import triton
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction

        @triton.jit
        def add_one(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1.0, mask=offs < n)

        if isinstance(add_one, InterpretedFunction) != mode.interpreted:  # loaded before the mode was set
            out["error"] = (f"Triton loaded {'compiled' if mode.interpreted else 'interpreted'}, where the tests "
                            f"run it {mode.label}")
            return out
        x = torch.arange(10, dtype=torch.float32, device="cpu" if mode.interpreted else "cuda")
        y = torch.empty_like(x)
        add_one[(1,)](x, y, 10, BLOCK=16)
        out["ok"] = bool(torch.equal(y, x + 1))
        out["error"] = None if out["ok"] else f"wrong result {y.tolist()}"
    except BaseException as error:  # whatever breaks is the answer
        text = str(error).strip()
        out["error"] = f"{type(error).__name__}: {text.splitlines()[-1] if text else ''}"
    return out


if __name__ == "__main__":
    print("KATA-PROBE " + json.dumps(probe()))
