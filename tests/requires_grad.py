"""The backward of an attention function whose inputs do not all require a gradient (frozen keys
beside trained values, as when a model freezes part of itself): each input that requires one gets its
own, the others None (exercises 09 and 13)."""
from checks import assert_close
from triton_helpers import as_numpy, call

FROZEN = ["q", "k", "v", "k-and-v"]  # test ids: the inputs made with requires_grad=False
RULE = ("the backward returns a gradient for each input that requires one (ctx.needs_input_grad[i] for "
        "input i: 0 q, 1 k, 2 v); autograd leaves the others None")


def check_frozen(attention_fn, q, k, v, do, frozen: str, expected, what: str, tol: float, convention: str) -> None:
    """attention_fn(q, k, v).backward(do) with the inputs `frozen` names not requiring a gradient;
    expected: float64 (dq, dk, dv). Each other input's .grad within tol of its expected gradient
    (relative to its largest entry), each frozen one's None."""
    __tracebackhide__ = True
    trained = [name not in frozen.split("-and-") for name in "qkv"]
    leaves = [t.detach().clone().requires_grad_(wanted) for t, wanted in zip((q, k, v), trained)]
    call(lambda: attention_fn(*leaves).backward(do))
    what = f"{what} with {' and '.join(frozen.split('-and-'))} frozen (requires_grad=False)"
    for name, leaf, wanted, want in zip("qkv", leaves, trained, expected):
        if (leaf.grad is not None) != wanted:
            raise AssertionError(f"{what}: {name}.grad is {'None' if wanted else 'set'}, expected "
                                 f"{'d' + name if wanted else 'None'}\n  convention: {RULE}")
        if wanted:
            size = max(1.0, want.abs().max().item())
            assert_close(as_numpy(leaf.grad), as_numpy(want), what=f"{what}: d{name}", rtol=tol, atol=tol * size,
                         convention=convention)
