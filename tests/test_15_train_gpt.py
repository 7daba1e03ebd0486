"""Tests for exercise 15: the attention layer against torch's reference layer, a packed row against
its documents run one at a time, and a short training run.

The reference layer is built from the learner's layer's own parameters (qkv, proj), in float64:
torch's scaled_dot_product_attention (its math backend, which takes a dropout mask) under the mask
14's dropout_mask draws for the layer's seed. Without a CUDA device the kernels run in Triton's
interpreter on the CPU, at small sizes; with one, the same tests run compiled. Each test's docstring
names the bugs it catches; mutants/15_train_gpt.toml holds them.
"""
import time

import numpy as np
import pytest

from checks import assert_close

torch = pytest.importorskip("torch", reason="skipped: exercise 15 needs PyTorch")
import torch.nn.functional as F  # noqa: E402
# Before Triton loads: without CUDA, triton_helpers sets TRITON_INTERPRET=1, which Triton reads then.
from triton_helpers import DEVICE, LOG_OF_ZERO_WANTED, as_numpy, call  # noqa: E402  (where Triton is missing, it skips this file)

from kata.given import needle  # noqa: E402
from kata.given.gpt import GPT, IGNORE, AttentionParameters, GPTConfig  # noqa: E402
from kata.given.solved import solved  # noqa: E402
from kata.given.train import train  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"), LOG_OF_ZERO_WANTED]
LAYER = ("q, k, v = split(x W_qkv + b_qkv), heads (B, n_head, T, D); causal attention with dropout "
         "(dropout_mask(seed, p, ...), p the config's in training, 0 in evaluation); heads joined, then proj")
PACKED = ("a packed row gives each document what it gets alone: attention within the document (doc_ids), "
          "positions from 0 at each document's start, targets within the document (IGNORE at its last token)")
TOL = 2e-5  # float32 through the kernels against float64: relative to the largest expected entry


def layer_of(ex, n_embd=32, n_head=2, dropout=0.0, block_size=64):
    """The learner's layer with random parameters from torch's seeded generator, on DEVICE."""
    config = GPTConfig(needle.VOCAB, block_size, n_layer=1, n_head=n_head, n_embd=n_embd, dropout=dropout)
    return ex.CausalSelfAttention(config).to(DEVICE)


def torch_layer(x, qkv_weight, qkv_bias, proj_weight, proj_bias, n_head: int, dropout_p: float, seed: int):
    """The layer in torch: scaled_dot_product_attention's math backend, causal, under the mask 14's
    dropout_mask(seed, dropout_p, ...) draws; in x's dtype, differentiable."""
    B, T, C = x.shape
    qkv = F.linear(x, qkv_weight, qkv_bias)
    q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in qkv.split(C, dim=2))
    mask = solved("14").dropout_mask(seed, dropout_p, B, n_head, T, T, device=x.device) if dropout_p else None
    y, _ = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, None, dropout_p, True, mask)
    return F.linear(y.transpose(1, 2).reshape(B, T, C), proj_weight, proj_bias)


def reference(layer, x, n_head: int, dropout_p: float, seed: int):
    """torch_layer on the layer's own parameters in float64: (out, x, {name: parameter}), x and the
    parameters leaves."""
    params = {name: p.detach().double().requires_grad_() for name, p in layer.named_parameters()}
    x = x.detach().double().requires_grad_()
    out = torch_layer(x, params["qkv.weight"], params["qkv.bias"], params["proj.weight"], params["proj.bias"],
                      n_head, dropout_p, seed)
    return out, x, params


class TorchAttention(AttentionParameters):
    """The reference layer for the training check: the exercise's parameters, torch's attention."""

    def forward(self, x, doc_ids=None, seed=0):
        return torch_layer(x, self.qkv.weight, self.qkv.bias, self.proj.weight, self.proj.bias, self.n_head,
                           self.dropout if self.training else 0.0, seed)


def grads_of(out, dout, x, params) -> dict:
    """{name: gradient} of sum(out ∘ dout) for x and every parameter."""
    (out * dout).sum().backward()
    return {"x": x.grad, **{name: p.grad for name, p in params.items()}}


def compare(got: dict, expected: dict, what: str, convention: str, tol: float = TOL) -> None:
    """Each named tensor against its float64 value, relative to the largest expected entry."""
    __tracebackhide__ = True
    for name, e in expected.items():
        g = got[name]
        if g is None:
            raise AssertionError(f"{what}: {name} got no gradient (is the layer's output cut from the graph?)"
                                 f"\n  convention: {convention}")
        size = max(1.0, e.abs().max().item())
        assert_close(as_numpy(g), as_numpy(e), what=f"{what}: {name}", rtol=tol, atol=tol * size,
                     convention=convention)


# ---------------------------------------------------------------- the layer -------------------------

LAYER_CASES = {  # id: (B, T, n_embd, n_head, dropout, training)
    "train-p0.3-b2-t33-h2": (2, 33, 32, 2, 0.3, True),
    "train-p0-b1-t20-h4": (1, 20, 64, 4, 0.0, True),
    "eval-p0.3-b2-t17-h2": (2, 17, 32, 2, 0.3, False),
}


@pytest.mark.parametrize("case", LAYER_CASES.values(), ids=LAYER_CASES.keys())
def test_layer_equals_torch_reference(ex, rng, case):
    """Heads split from (B, T, C) without the transpose, or joined back without it; q and k swapped;
    attention not causal; the output projection left out; dropout off in training, on in evaluation,
    or drawn from another seed than the layer's; the output cut from the graph (no gradient reaches
    x or the parameters). T is not a multiple of the kernels' tiles; the ids say B, T and n_head."""
    B, T, C, H, p, training = case
    torch.manual_seed(int(rng.integers(2**31)))
    layer = layer_of(ex, C, H, p).train(training)
    seed = int(rng.integers(1, 2**40))
    x = torch.from_numpy(rng.standard_normal((B, T, C))).float().to(DEVICE).requires_grad_()
    dout = torch.from_numpy(rng.standard_normal((B, T, C))).float().to(DEVICE)
    out = call(layer, x, seed=seed)
    expected, x64, params = reference(layer, x, H, p if training else 0.0, seed)
    what = f"CausalSelfAttention(n_embd={C}, n_head={H}, dropout={p}).{'train' if training else 'eval'}()(x {(B, T, C)}, seed={seed})"
    compare({"out": out}, {"out": expected}, what, LAYER)
    call(lambda: (out * dout).sum().backward())
    got = {"x": x.grad, **{name: prm.grad for name, prm in layer.named_parameters()}}
    compare(got, grads_of(expected, dout.double(), x64, params), f"{what}, backward", LAYER)


def test_packed_row_refuses_dropout_in_training(ex, rng):
    """Dropout silently left out of a packed row (13's kernel has none): a model configured with dropout
    would train without it. In evaluation the same row runs."""
    layer = layer_of(ex, dropout=0.1).train()
    x = torch.from_numpy(rng.standard_normal((1, 20, 32))).float().to(DEVICE)
    doc_ids = torch.tensor([0] * 8 + [1] * 12, device=DEVICE)
    with pytest.raises(ValueError):
        call(layer, x, doc_ids=doc_ids)
    call(layer.eval(), x, doc_ids=doc_ids)


# ---------------------------------------------------------------- packing --------------------------

def test_pack_layout(ex):
    """Positions counted along the row instead of restarting at each document; a document's last
    target taken from the next document instead of IGNORE; one document id for all; padding added."""
    docs = [torch.tensor([5, 6, 7]), torch.tensor([8]), torch.tensor([9, 10])]
    batch = call(ex.pack, docs)
    expected = dict(tokens=[[5, 6, 7, 8, 9, 10]], targets=[[6, 7, IGNORE, IGNORE, 10, IGNORE]],
                    positions=[[0, 1, 2, 0, 0, 1]], doc_ids=[0, 0, 0, 1, 2, 2])
    for field, want in expected.items():
        got = getattr(batch, field)
        if got is None or got.tolist() != want:
            raise AssertionError(f"pack([5 6 7], [8], [9 10]).{field}: expected {want}, got "
                                 f"{None if got is None else got.tolist()}\n  convention: {PACKED}")


def test_packed_row_equals_documents_one_at_a_time(ex, rng):
    """A packed row attended causally across documents (doc_ids ignored) or with one id for all,
    positions not restarted, targets crossing into the next document: the loss or a gradient differs
    from the documents run alone. Three documents of 5 to 40 tokens in blocks of 32."""
    torch.manual_seed(int(rng.integers(2**31)))
    model = GPT(GPTConfig(needle.VOCAB, 48, n_layer=2, n_head=2, n_embd=32), ex.CausalSelfAttention).to(DEVICE)
    docs = [d.to(DEVICE) for d in needle.documents(rng, 3, 5, 40)]
    batch = call(ex.pack, docs)
    _, loss = call(model, batch.tokens, batch.targets, batch.positions, batch.doc_ids)
    call(loss.backward)
    got = {"loss": loss.detach(), **{name: p.grad.clone() for name, p in model.named_parameters()}}
    model.zero_grad()
    total = sum(len(d) - 1 for d in docs)
    alone = sum(torch.nn.functional.cross_entropy(call(model, d[None])[0, :-1], d[1:], reduction="sum")
                for d in docs) / total
    alone.backward()
    expected = {"loss": alone.detach(), **{name: p.grad for name, p in model.named_parameters()}}
    lengths = [len(d) for d in docs]
    compare(got, expected, f"GPT on pack(documents of {lengths} tokens) against each document alone", PACKED,
            tol=1e-4)


# ---------------------------------------------------------------- training -------------------------

TRAIN = dict(n=32, batch=8, steps=15, lr=1e-2)
LOSS_TOL = 1e-4  # float32 kernels against float32 torch: the reference solution's largest gap is 2e-7 to 1.2e-6
LOSS_BELOW = 2.2  # from ln(25) = 3.2: the reference solution's last 5 average 1.76 to 1.82 (the filler's floor is ln 2)


def losses_of(model, seed: int) -> list[float]:
    """The given loop's loss at every step on needle rows drawn from `seed`."""
    data = np.random.default_rng(seed)
    losses = []
    train(model, lambda step: needle.as_batch(needle.rows(data, TRAIN["batch"], TRAIN["n"]).to(DEVICE)),
          TRAIN["steps"], TRAIN["lr"], every=1, report=lambda progress: losses.append(progress.loss))
    return losses


def test_training_follows_torch_and_lowers_the_loss(ex, rng):
    """The layer in the model and the given loop: a one-layer GPT (2 heads, n_embd 32, dropout 0.1) trained
    15 steps of AdamW on needle rows of 32 tokens, 8 a step, from one initialisation with the exercise's
    layer and with torch's (the same dropout masks): the losses must agree step by step within LOSS_TOL,
    and the last 5 average under LOSS_BELOW. Catches a layer whose parameters train otherwise than
    torch's (an output cut from the graph trains only the rest of the model), attention that is not
    causal (a model that reads the next token), dropout that follows another seed at each step."""
    torch.manual_seed(int(rng.integers(2**31)))
    config = GPTConfig(needle.VOCAB, TRAIN["n"], n_layer=1, n_head=2, n_embd=32, dropout=0.1)
    model = GPT(config, ex.CausalSelfAttention).to(DEVICE)
    torch_model = GPT(config, TorchAttention).to(DEVICE)
    torch_model.load_state_dict(model.state_dict())
    data_seed = int(rng.integers(2**31))
    start = time.perf_counter()
    ours = call(losses_of, model, data_seed)
    seconds = time.perf_counter() - start
    theirs = losses_of(torch_model, data_seed)
    gaps = [abs(a - b) for a, b in zip(ours, theirs)]
    worst = max(range(len(gaps)), key=gaps.__getitem__)
    last = sum(ours[-5:]) / 5
    print(f"\n{TRAIN['steps']} steps in {seconds:.1f} s; largest loss gap {gaps[worst]:.1e} at step {worst + 1}; "
          f"the last 5 losses average {last:.3f}")
    shown = f"losses {[round(x, 3) for x in ours]}, torch's {[round(x, 3) for x in theirs]}"
    if gaps[worst] > LOSS_TOL:
        raise AssertionError(f"training a 1-layer GPT: step {worst + 1}'s loss is {ours[worst]:.5f}, torch's layer "
                             f"gives {theirs[worst]:.5f} (tolerance {LOSS_TOL})\n  {shown}\n  convention: {LAYER}")
    if not last < LOSS_BELOW:
        raise AssertionError(f"training a 1-layer GPT for {TRAIN['steps']} steps: the last 5 losses average {last:.3f}, "
                             f"expected under {LOSS_BELOW}\n  {shown}\n  convention: {LAYER}")
