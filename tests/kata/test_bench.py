"""The benchmark's arithmetic and its table, on made-up timings (the timing itself needs a GPU)."""
from kata.bench.forward import report

NAMES = ["yours", "reference", "sdpa default", "sdpa flash", "naive"]


def cell(ms, mib):
    return {"ms": ms, "tflops": 1.0, "mib": mib}


def rows():
    """Two cells, B*N fixed: the fused methods' memory is flat in total, naive's grows with N."""
    out = []
    for n, b, naive_mib in ((1024, 16, 2560.0), (2048, 8, 4608.0)):
        out.append(dict(D=64, causal=False, N=n, B=b, H=32, **{"default is": "cudnn_attention"},
                        yours={"note": "not started"}, reference=cell(1.0, 480.0), **{
                            "sdpa default": cell(0.9, 480.0), "sdpa flash": cell(1.5, 480.0)},
                        naive=cell(4.0, naive_mib)))
    return out


def test_ratios_and_their_geometric_mean_name_the_baseline():
    """A ratio inverted (ours / theirs in time) or a mean over the wrong cells misstates the speed."""
    text = report(rows(), NAMES)
    assert "reference vs sdpa flash: geometric mean 1.50x, min 1.50x, max 1.50x over 2 cells" in text
    assert "reference vs sdpa default: geometric mean 0.90x" in text
    assert "yours vs" not in text  # no number for an unfinished kernel


def test_unfinished_kernel_shows_as_not_started_in_every_table():
    text = report(rows(), NAMES)
    assert text.count("not started") == 2 * 4  # ms, TFLOP/s, memory, memory per sequence


def test_memory_per_sequence_shows_linear_against_quadratic():
    """B*N is fixed, so only the per-sequence view shows fused memory linear in N and naive N^2."""
    table = report(rows(), NAMES).split("peak memory per sequence")[1].split("\n\n")[0]
    lines = table.splitlines()
    assert lines[-2].split()[-4:] == ["30.0", "30.0", "30.0", "160.0"]
    assert lines[-1].split()[-4:] == ["60.0", "60.0", "60.0", "576.0"]
