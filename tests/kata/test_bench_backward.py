"""The forward + backward benchmark's arithmetic and tables, the paper's Figure 2 table, Nsight
Compute's CSV, and the dispatch among the benchmarks, on made-up numbers (timing needs a GPU)."""
import pytest

from kata.bench import decode as bench_decode, forward as bench, main as bench_main, paper as bench_paper
from kata.bench import sparse as bench_sparse

NAMES = ["yours", "reference", "sdpa default", "sdpa flash", "naive"]


def cell(bwd_ms, ms):
    return {"bwd_ms": bwd_ms, "bwd_tflops": 1.0, "ms": ms, "tflops": 1.0, "mib": 100.0}


def rows():
    return [dict(D=64, causal=True, N=n, B=16384 // n, H=32, **{"default is": "flash_attention"},
                 yours={"note": "not started"}, reference=cell(2.0, 3.0),
                 **{"sdpa default": cell(2.5, 3.3), "sdpa flash": cell(3.0, 3.6)}, naive={"note": "OOM"})
            for n in (2048, 4096)]


def test_backward_ratios_use_backward_times_and_name_the_pass():
    """A ratio taken from the forward + backward times (or inverted) misstates the backward's speed."""
    text = bench.training_report(rows(), NAMES)
    assert "reference vs sdpa flash, backward: geometric mean 1.50x, min 1.50x, max 1.50x over 2 cells" in text
    assert "reference vs sdpa default, backward: geometric mean 1.25x" in text
    assert "reference vs sdpa flash, forward + backward: geometric mean 1.20x" in text
    assert "yours vs" not in text


def test_backward_tables_show_every_method_and_note():
    text = bench.training_report(rows(), NAMES)
    for title in ("backward, median ms", "backward, TFLOP/s", "forward + backward, median ms",
                  "forward + backward, TFLOP/s", "forward + backward, peak memory, MiB"):
        assert f"\n{title}\n" in text
    assert text.count("not started") == 2 * 5 and text.count("OOM") == 2 * 5
    assert "2.000" in text and "3.300" in text  # milliseconds keep three decimals


def test_backward_counts_two_and_a_half_forwards():
    assert bench.BACKWARD_FLOPS == 2.5
    counted, executed = bench_paper.paper_flops(bench_paper.STANDARD)
    matmul = 2 * 64 * 16 * 1024 * 1024 * 64
    assert round(counted * 1e9) == round(3.5 * matmul)  # (1 + 2.5) x the causal forward's 2 matmuls / 2
    assert round(executed * 1e9) == 6 * matmul  # standard attention computes every score
    assert bench_paper.paper_flops("yours (09)")[1] < executed


NCU_CSV = '''==PROF== Connected to process 123
==PROF== Profiling "_attn_fwd": 0%....50%....100% - 2 passes
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","123","python","host","_attn_fwd","1","7","(128, 1, 1)","(16384, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","1,000,000"
"0","123","python","host","_attn_fwd","1","7","(128, 1, 1)","(16384, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","250000"
"1","123","python","host","_bwd_dq","1","7","(128, 1, 1)","(16384, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","Mbyte","2.5"
'''


def test_ncu_csv_sums_reads_and_writes_over_every_kernel():
    """Thousands separators, units and the profiler's own lines before the table."""
    assert bench_paper.ncu_bytes(NCU_CSV) == 1_000_000 + 250_000 + 2_500_000


def test_ncu_output_without_a_table_is_an_error():
    try:
        bench_paper.ncu_bytes("==PROF== No kernels were profiled.\n")
    except ValueError as err:
        assert "no CSV table" in str(err)
    else:
        raise AssertionError("expected ValueError")


def test_paper_table_puts_the_a100_figures_beside_ours():
    columns = {bench_paper.STANDARD: {"counted": 481.0, "executed": 824.6, "ms": 30.0, "gib": 9.5, "ncu": 35.2},
               "yours (09)": {"counted": 481.0, "executed": 695.8, "note": "not started"}}
    text = bench_paper.paper_table(columns, {"standard": 30.9, "flash": 4.7}, "NVIDIA H200")
    assert "on NVIDIA H200" in text
    line = next(x for x in text.splitlines() if x.strip().startswith("HBM R/W GB, model"))
    assert line.split()[-4:] == ["30.9", "4.7", "40.3", "4.4"]
    line = next(x for x in text.splitlines() if x.strip().startswith("runtime, ms"))
    assert line.split()[-5:] == ["30.00", "not", "started", "41.7", "7.3"]
    assert "66.6" in text and "75.2" in text


def test_paper_model_reads_the_closed_forms_of_05_and_08():
    gb = bench_paper.paper_model_gb()
    assert 25 < gb["standard"] < 45 and 2 < gb["flash"] < 8  # the paper measured 40.3 and 4.4


@pytest.mark.parametrize("module, name", [(bench_decode, "decode"), (bench_paper, "paper"), (bench_sparse, "sparse"),
                                          (bench, "")], ids=["decode", "paper", "sparse", "forward"])
def test_the_first_word_picks_the_benchmark_and_the_rest_are_its_flags(monkeypatch, tmp_path, module, name):
    """A word passed on to the forward benchmark, or flags dropped, runs another benchmark than asked."""
    seen = []
    monkeypatch.setattr(module, "main", lambda target, argv: seen.append((target, argv)) or 7)
    assert bench_main.main(tmp_path, [name, "--n", "4096"] if name else ["--n", "4096"]) == 7
    assert seen == [(tmp_path, ["--n", "4096"])]


def test_paper_without_a_gpu_measures_nothing(monkeypatch, capsys, tmp_path):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_main.main(tmp_path, ["paper"]) == 2
    assert "nothing was measured" in capsys.readouterr().out
