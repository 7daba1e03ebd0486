"""The compile check reads how each tl.dot multiplies float32 from the IR it builds (tests/gpu_compile.py):
IEEE under torch's default setting, as torch's matmuls; TF32 allowed where the user asked torch for it."""
import pytest

from kata.gpu import triton_missing

pytest.importorskip("torch", reason="skipped: the compile check runs torch's kernels")
if missing := triton_missing():
    pytest.skip(f"skipped: {missing}", allow_module_level=True)

from gpu_compile import compile_for_gpus, dot_precisions  # noqa: E402
from torch_settings import float32_matmul_precision  # noqa: E402

# One float32 product per kernel, as a learner might write it: through the wrapper's PRECISION, or not.
PROBES = '''
import triton
import triton.language as tl


@triton.jit
def product(A, B, C, PRECISION: tl.constexpr, HOW: tl.constexpr):
    r = tl.arange(0, 16)
    a = tl.load(A + r[:, None] * 16 + r[None, :])
    b = tl.load(B + r[:, None] * 16 + r[None, :])
    if HOW == "given":
        c = tl.dot(a, b, input_precision=PRECISION)
    elif HOW == "tf32":
        c = tl.dot(a, b, input_precision="tf32")
    elif HOW == "ieee":
        c = tl.dot(a, b, input_precision="ieee")
    else:
        c = tl.dot(a, b)
    tl.store(C + r[:, None] * 16 + r[None, :], c)
'''
LINES = {"tf32": 'c = tl.dot(a, b, input_precision="tf32")', "default": "c = tl.dot(a, b)"}


@pytest.fixture
def probes(tmp_path):
    """A launch of `product` for each way of choosing the precision: how -> (dtype, precision passed) -> launch."""
    path = tmp_path / "probes.py"
    path.write_text(PROBES, encoding="utf-8")
    module = f"probes_{abs(hash(str(tmp_path)))}"  # the compiling process keeps modules by name

    def launch(how: str, dtype: str, precision: str) -> dict:
        pointer = {"float32": "*fp32", "float16": "*fp16"}[dtype]
        return dict(file=str(path), module=module, name="product", options={}, dots=dot_precisions(),
                    signature={"A": pointer, "B": pointer, "C": "*fp32", "PRECISION": "constexpr", "HOW": "constexpr"},
                    constexprs={"PRECISION": precision, "HOW": how})
    return launch


def test_float32_dots_must_be_ieee_under_torchs_default(probes):
    """TF32 hard-coded, or left to tl.dot's default (TF32), where torch computes float32 in full:
    named with the line and the rule; the given precision and "ieee" pass."""
    assert dot_precisions()["float32"] == "ieee", "a test before this one left torch asking for TF32"
    lines = compile_for_gpus([probes(how, "float32", "ieee") for how in ("given", "ieee", "tf32", "default")])
    assert len(lines) == 2 and {how for how, text in LINES.items() for line in lines if text in line} == set(LINES), lines
    for line in lines:
        assert line.startswith("product: ") and "probes.py:" in line and "in float32)" in line, line
        assert "float32 multiplied in TF32 where torch was not asked for it" in line, line
        assert "pass input_precision=PRECISION to every tl.dot" in line, line


def test_a_float16_launch_is_judged_as_its_float32_copy(probes):
    """The compile check also compiles a float16 launch in float32: a kernel or a wrapper that passes
    TF32 whatever the dtype fails there, and the given precision (float16's, "ieee") passes."""
    lines = compile_for_gpus([probes("given", "float16", "ieee"), probes("tf32", "float16", "ieee"),
                              probes("given", "float16", "tf32")])
    assert len(lines) == 2 and all(line.endswith("(on Ampere (sm_80), in float32)") for line in lines), lines
    assert sorted(LINES["tf32"] in line for line in lines) == [False, True], lines
    assert any("`c = tl.dot(a, b, input_precision=PRECISION)`" in line for line in lines), lines


def test_tf32_passes_where_torch_was_asked_for_it_and_ieee_too(probes):
    """torch.set_float32_matmul_precision("high"), as a user sets it for speed: TF32 is what was
    asked for, and IEEE is slower, never less exact: every way passes, the float16 launch's float32
    copy too."""
    with float32_matmul_precision("high"):
        assert dot_precisions() == {"float16": "ieee", "float32": "tf32"}
        launches = [probes(how, "float32", "tf32") for how in ("given", "ieee", "tf32", "default")]
        launches.append(probes("given", "float16", "ieee"))
    assert compile_for_gpus(launches) == []
