"""The training benchmark's cell loop, table and plot on the CPU: a fake clock, a layer that runs out of
memory, tiny real models (the timing and the long contexts need a GPU)."""
import itertools

import pytest

from kata.bench import main as bench_main
from kata.bench.common import ColumnError
from kata.bench.train import (REFERENCE, SDPA, STANDARD, methods, new_model, parse, plot, report, run_accuracy,
                              run_cells, speedup, summary, torch_layer)
from kata.tools.train import EVAL_ROWS
from kata.exercises import SOLUTIONS_DIR
from kata.gpu import triton_missing

torch = pytest.importorskip("torch")
from kata.given import needle  # noqa: E402 - needle needs torch
from kata.given.gpt import IGNORE  # noqa: E402
NAMES = [STANDARD, SDPA, REFERENCE]
TINY = dict(layers=1, heads=2, embd=16, dropout=0.1)


def rows():
    """n = 2k and 4k, B·n fixed: at 4k the reference 2.5x standard and 1.25x SDPA in tokens/s at the
    same peak memory; at 8k standard attention is out of memory and the reference trains."""
    out = []
    for n, std, sdpa in ((2048, {"tokens_s": 100.0, "mib": 3000.0}, 150.0), (4096, {"tokens_s": 80.0, "mib": 9000.0},
                                                                              160.0),
                         (8192, {"note": "OOM"}, 170.0)):
        out.append({"n": n, "B": 65536 // n, "backend": "flash_attention", STANDARD: std,
                    SDPA: {"tokens_s": sdpa, "mib": 900.0}, REFERENCE: {"tokens_s": 200.0, "mib": 800.0}})
    return out


def oom_layer(config):
    """A layer whose forward runs out of memory, as standard attention does at long n."""
    class OutOfMemory(torch.nn.Module):
        def forward(self, x, doc_ids=None, seed=0):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")
    return OutOfMemory()


def test_speedup_is_their_tokens_per_s_over_the_slower():
    """An inverted ratio (time-like) would call the reference 2.5x faster 0.4x; OOM has no ratio."""
    r = rows()
    assert speedup(r[1], REFERENCE, STANDARD) == 2.5
    assert speedup(r[1], REFERENCE, SDPA) == 1.25
    assert speedup(r[2], REFERENCE, STANDARD) is None


def test_summary_checks_the_goals_from_4k_on_and_names_the_contexts_standard_cannot_fit():
    """The 2x goal counts from n = 4k (2k's 2.0x is not the worst over 4k on), 1.0x SDPA everywhere;
    memory is reported flat-or-not; the OOM context where the reference trains is named."""
    lines = summary(rows(), REFERENCE)
    assert lines[0] == "reference vs standard from n = 4096: at least 2.50x (at n = 4096; goal 2.0x): met"
    assert lines[1] == "reference vs sdpa: at least 1.18x (at n = 8192; goal 1.0x): met"
    assert lines[2] == ("reference's peak memory: 800 to 800 MiB over n = 2048 to 8192 (1.00x; "
                        "flat: linear in n)")
    assert lines[3] == "standard attention runs out of memory at n = 8192; reference trains there"
    slow = rows()
    slow[0][REFERENCE]["tokens_s"] = 50.0
    assert summary(slow, REFERENCE)[1] == "reference vs sdpa: at least 0.33x (at n = 2048; goal 1.0x): missed"


def test_report_shows_oom_in_its_cells_and_both_ratios():
    text = report(rows(), NAMES, REFERENCE)
    assert text.count("OOM") == 2  # standard's tokens/s and its memory at 8k
    assert "2.50" in text and "1.25" in text and "here flash_attention" in text
    assert max(map(len, text.splitlines())) <= 110


def test_cell_loop_times_with_its_clock_and_goes_on_after_out_of_memory():
    """Real tiny models on the CPU, one step a cell, a clock that advances 2 s a call: tokens/s is
    B·n·steps / 2 in every cell; the out-of-memory layer gets OOM at each n, the others still run."""
    if missing := triton_missing():  # methods() loads the reference's layer, which runs Triton kernels
        pytest.skip(missing)
    layers = {name: layer for name, layer in methods(torch, SOLUTIONS_DIR).items() if name != REFERENCE}
    layers["oom"] = oom_layer
    clock = itertools.count(step=2.0).__next__
    said = []
    got = run_cells(torch, layers, [32, 64], 64, TINY, steps=1, warmup=1, device="cpu", dtype=torch.float32,
                    clock=clock, say=lambda line, flush: said.append(line))
    assert [(r["n"], r["B"]) for r in got] == [(32, 2), (64, 1)]
    for r in got:
        assert r["oom"] == {"note": "OOM"}
        for name in (STANDARD, SDPA):
            assert r[name]["tokens_s"] == 32.0 and r[name]["mib"] is None
            assert 2.0 < r[name]["loss"] < 5.0  # near log(25), the untrained loss: a real step ran
    assert said[0] == "n=32 B=2: standard 32 tokens/s, sdpa 32 tokens/s, oom OOM tokens/s"


def test_the_kernels_layer_trains_a_step_on_the_cpu():
    """15's layer as the benchmark builds it (methods: the target's file on the solved 13 and 14) runs
    one real step in Triton's interpreter: a wrong name or signature there would stop the GPU run."""
    if missing := triton_missing():
        pytest.skip(missing)
    layer = methods(torch, SOLUTIONS_DIR)[REFERENCE]
    got = run_cells(torch, {REFERENCE: layer}, [32], 32, TINY, steps=1, warmup=0, device="cpu", dtype=torch.float32,
                    say=lambda line, flush: None)
    assert got[0][REFERENCE]["tokens_s"] > 0 and 2.0 < got[0][REFERENCE]["loss"] < 5.0


def test_a_bug_in_a_layer_stops_the_benchmark_naming_it():
    """An error other than out of memory is a bug: a note in the table would hide it."""
    def broken(config):
        raise TypeError("unexpected keyword")
    with pytest.raises(ColumnError, match="'broken'"):
        run_cells(torch, {"broken": broken}, [32], 32, TINY, 1, 0, device="cpu", dtype=torch.float32)


def with_accuracy():
    """rows() with the reference's accuracy: 50% at 2k and 4k, 25% at 8k, where standard attention is out of memory."""
    out = rows()
    for r, acc in zip(out, (0.5, 0.5, 0.25)):
        r["accuracy"] = {"accuracy": acc, "loss": 1.0}
    return out


def test_accuracy_is_a_column_and_named_where_standard_cannot_fit():
    """The accuracy measured but not shown, or shown for the wrong context; the OOM contexts' accuracy
    is the claim (chance is 1/8)."""
    text = report(with_accuracy(), NAMES, REFERENCE)
    assert "accuracy" in text.splitlines()[3] and "25.0%" in text.splitlines()[-1]
    assert summary(with_accuracy(), REFERENCE)[-1] == \
        "reference's long-range accuracy there: 25.0% at 8192 (chance 12.5%)"
    assert "accuracy" not in report(rows(), NAMES, REFERENCE)


def test_accuracy_trains_where_the_layer_fits_and_measures_held_out_rows(monkeypatch):
    """Tiny real models on the CPU, two steps: an accuracy over the EVAL_ROWS held-out rows (a multiple
    of 1/EVAL_ROWS), after a loss on the answers alone (every token's drowns them at long n); a context
    where the layer ran out of memory is not trained."""
    answers_only, trained = needle.answers_only, []
    monkeypatch.setattr(needle, "answers_only", lambda batch: trained.append(answers_only(batch)) or trained[-1])
    layer = torch_layer(lambda q, k, v, p: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
    got = [{"n": 32, "B": 2, SDPA: {"tokens_s": 1.0}}, {"n": 64, "B": 1, SDPA: {"note": "OOM"}}]
    said = []
    run_accuracy(torch, got, SDPA, layer, TINY, 2, device="cpu", dtype=torch.float32,
                 say=lambda line, flush: said.append(line))
    accuracy = got[0]["accuracy"]["accuracy"]
    assert 0.0 <= accuracy <= 1.0 and (accuracy * EVAL_ROWS).is_integer() and 2.0 < got[0]["accuracy"]["loss"] < 5.0
    assert got[1]["accuracy"] == {"note": "-"} and said == [f"n=32: sdpa trained 2 steps, accuracy {accuracy:.1%}"]
    assert len(trained) == 2 and all((b.targets != IGNORE).sum() == 2 for b in trained)


@pytest.mark.parametrize("measured", [rows, with_accuracy], ids=["speed", "speed-and-accuracy"])
def test_plot_is_saved_where_asked(tmp_path, capsys, measured):
    pytest.importorskip("matplotlib")
    plot(measured(), NAMES, tmp_path / "train.png")
    assert (tmp_path / "train.png").stat().st_size > 0
    assert f"plot: {tmp_path / 'train.png'}" in capsys.readouterr().out


def test_train_without_a_gpu_measures_nothing(monkeypatch, capsys, tmp_path):
    if missing := triton_missing():  # the benchmark stops earlier, on the missing Triton
        pytest.skip(missing)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_main.main(tmp_path, ["train"]) == 2
    out = capsys.readouterr().out
    assert "nothing was measured" in out and "python grader.py 15" in out


def test_dropout_is_every_methods_and_refused_outside_its_range(capsys):
    """--dropout reaching one method only would compare a masked step with an unmasked one; p = 1 drops every weight."""
    assert parse([]).dropout == 0.1 and parse(["--dropout", "0"]).dropout == 0.0
    layer = torch_layer(lambda q, k, v, p: q)
    assert new_model(torch, layer, 32, dict(TINY, dropout=0.3), "cpu").config.dropout == 0.3
    with pytest.raises(SystemExit):
        parse(["--dropout", "1"])
    assert "--dropout must lie in [0, 1)" in capsys.readouterr().err
