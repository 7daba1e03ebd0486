"""The block-sparse benchmark's arithmetic, table and plot, on made-up timings (the timing needs a GPU)."""
import pytest

from kata.bench import main as bench_main
from kata.bench.sparse import DENSE, FLEX, TARGET_MASK, TARGET_N, YOURS, parse, report, speedup, summary
from kata.gpu import triton_missing


def rows():
    """Two masks at 64k: yours 7.5x dense causal and 2x flex on the 4k window, unfinished nowhere; the
    causal row's flex did not compile."""
    out = []
    for mask, density, mine, flex in (("causal", 0.501, 10.0, {"note": "did not compile (RuntimeError)"}),
                                      (TARGET_MASK, 0.064, 1.5, {"ms": 3.0, "tflops": 400.0})):
        cells = {YOURS: {"ms": mine, "tflops": 300.0, "err": 2e-3}, FLEX: flex, DENSE: {"ms": 11.25, "tflops": 500.0},
                 "flex compile s": None if "note" in flex else 12.0}
        out.append({"mask": mask, "n": TARGET_N, "B": 1, "density": density, "pairs": 1, "backend": "cudnn_attention",
                    "fwd": cells, "train": {**cells, YOURS: {"note": "not started"}}})
    return out


def test_speedups_are_the_slower_time_over_yours():
    """An inverted ratio would call a kernel 7.5x faster than dense causal 0.13x."""
    r = rows()[1]
    assert speedup(r, "fwd", YOURS, DENSE) == 7.5
    assert speedup(r, "fwd", YOURS, FLEX) == 2.0
    assert speedup(rows()[0], "fwd", YOURS, FLEX) is None  # no flex time: no ratio
    assert speedup(r, "train", YOURS, DENSE) is None


def test_summary_names_the_baseline_and_the_target_cell():
    lines = summary(rows(), "fwd", YOURS)
    assert lines == ["yours vs flex, forward: geometric mean 2.00x, min 2.00x, max 2.00x over 1 cells "
                     "(above 1: yours is faster)",
                     f"yours, {TARGET_MASK} at n = {TARGET_N}, forward: 7.5x dense causal (reference target 6x)"]
    assert summary(rows(), "train", YOURS) == []  # not started: no ratio, no target line


def test_summary_gives_the_range_of_the_rounds_own_ratios():
    """The fastest round of each hides how far apart one timing of each can fall: the range shows it."""
    timed = rows()
    timed[1]["fwd"][YOURS]["rounds"], timed[1]["fwd"][FLEX]["rounds"] = [1.6, 1.5, 2.0], [3.0, 3.3, 3.2]
    assert summary(timed, "fwd", YOURS)[1] == "  each from the fastest of 3 rounds; round by round 1.60x to 2.20x"


def test_report_holds_both_passes_their_notes_and_the_baseline():
    text = report(rows(), YOURS)
    assert "dense causal being SDPA with is_causal=True on every mask\n  (its default backend, cudnn_attention)" in text
    assert "\nforward\n" in text and "\nforward + backward\n" in text
    assert text.count("did not compile (RuntimeError)") == 2  # once a pass, in the ms column
    assert "7.50" in text and "2.00" in text and "2.0e-03" in text
    assert text.count("not started") == 2


def test_masks_on_the_command_line_take_dashes_for_spaces():
    assert parse(["--mask", "window-4k", "documents", "--n", "8192"]).masks == ["window 4k", "documents"]
    with pytest.raises(SystemExit):
        parse(["--mask", "window-2k"])


def test_plot_is_saved_where_asked(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from kata.bench.sparse import plot
    plot(rows(), YOURS, tmp_path / "sparse.png")
    assert (tmp_path / "sparse.png").stat().st_size > 0
    assert f"plot: {tmp_path / 'sparse.png'}" in capsys.readouterr().out


def test_sparse_without_a_gpu_measures_nothing(monkeypatch, capsys, tmp_path):
    torch = pytest.importorskip("torch")
    if missing := triton_missing():  # the benchmark stops earlier, on the missing Triton
        pytest.skip(missing)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_main.main(tmp_path, ["sparse"]) == 2
    assert "python grader.py 13" in capsys.readouterr().out
