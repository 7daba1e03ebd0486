"""A tiny Triton kernel run the way the Triton exercises' tests run it; prints one `KATA-PROBE {json}` line.

`python grader.py doctor` runs this as `python -m kata.grader.triton_probe` in a subprocess: a broken
Triton may hang or crash, and importing torch costs seconds. It lives in a file of its own because
Triton compiles a @jit function from its source file.
"""
import json
import os


def probe() -> dict:
    out = {"cuda": False, "device": None, "mode": None, "ok": False, "error": None, "torch_cuda": None,
           "bf16_missing": None}
    try:
        import torch
        from kata.gpu import bf16_missing
        out["cuda"] = torch.cuda.is_available()
        out["torch_cuda"] = torch.version.cuda  # None for a CPU build
        out["device"] = torch.cuda.get_device_name(0) if out["cuda"] else None
        out["bf16_missing"] = bf16_missing(torch) if out["cuda"] else None
        if not out["cuda"]:
            os.environ["TRITON_INTERPRET"] = "1"  # read when the kernel is defined: set it first
        out["mode"] = "compiled on the GPU" if out["cuda"] else "interpreter (TRITON_INTERPRET=1)"
        import triton
        import triton.language as tl

        @triton.jit
        def add_one(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1.0, mask=offs < n)

        x = torch.arange(10, dtype=torch.float32, device="cuda" if out["cuda"] else "cpu")
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
