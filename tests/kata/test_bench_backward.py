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
    assert bench_paper.paper_flops(bench_paper.STANDARD_DROPOUT) == (counted, executed)  # dropout is no matmul
    for kernel in ("yours (09)", "reference (14)"):
        assert bench_paper.paper_flops(kernel) == (counted, bench_paper.paper_flops("reference (09)")[1])
        assert bench_paper.paper_flops(kernel)[1] < executed


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


def paper_columns():
    """The six columns of `--bench paper`, made up: yours not started, the references and standard measured."""
    def measured(executed, ms, gib, ncu):
        return {"counted": 481.0, "executed": executed, "ms": ms, "gib": gib, "ncu": ncu}
    not_started = {"counted": 481.0, "executed": 695.8, "note": "not started"}
    return {bench_paper.STANDARD: measured(824.6, 30.0, 9.5, 35.2), "yours (09)": not_started,
            "reference (09)": measured(695.8, 3.0, 1.9, "skipped (--no-ncu)"),
            bench_paper.STANDARD_DROPOUT: measured(824.6, 40.0, 12.5, 50.0), "yours (14)": not_started,
            "reference (14)": measured(695.8, 4.0, 2.5, 2.0)}


MODEL = {bench_paper.STANDARD: 30.9, bench_paper.STANDARD_DROPOUT: 43.8, "flash": 4.7}


def table_lines(text, title):
    """The lines of the table under the line that starts with `title`, up to the blank line after it."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    return lines[start + 1:lines.index("", start)]


def row(lines, label):
    return next(line for line in lines if line.strip().startswith(label)).split()


def test_paper_table_puts_the_a100_figures_beside_ours():
    """The 09 columns and standard attention beside the paper's A100 numbers, the dropout columns apart."""
    text = bench_paper.paper_table(paper_columns(), MODEL, "NVIDIA H200")
    table = table_lines(text, "GPT-2 medium attention, forward + backward")
    assert "on NVIDIA H200" in text
    assert row(table, "HBM R/W GB, model")[-5:] == ["30.9", "4.7", "4.7", "40.3", "4.4"]
    assert row(table, "runtime, ms")[-6:] == ["30.00", "not", "started", "3.00", "41.7", "7.3"]
    assert "66.6" in text and "75.2" in text
    assert "(14)" not in "\n".join(table) and bench_paper.STANDARD_DROPOUT not in "\n".join(table)


def test_paper_dropout_table_holds_standard_with_dropout_and_14():
    """The dropout case: PyTorch's dropout against 14's kernels, the model's extra passes on standard's
    side only; a 09 column or the paper's figures in it would compare other steps."""
    text = bench_paper.paper_table(paper_columns(), MODEL, "NVIDIA H200")
    table = table_lines(text, "The same step with attention dropout, p = 0.1")
    assert table[0].split() == ["standard", "+", "dropout", "(PyTorch)", "yours", "(14)", "reference", "(14)"]
    assert row(table, "HBM R/W GB, model")[-3:] == ["43.8", "4.7", "4.7"]
    assert row(table, "HBM R/W GB, measured")[-4:] == ["50.0", "not", "started", "2.0"]
    assert row(table, "runtime, ms")[-4:] == ["40.00", "not", "started", "4.00"]
    assert row(table, "peak memory, GiB")[-4:] == ["12.50", "not", "started", "2.50"]


def test_paper_ratios_divide_each_kernel_into_its_own_standard():
    """Standard over FlashAttention: 09's columns over standard attention, 14's over standard with
    dropout (a 14 column over standard without dropout, or a ratio inverted, misstates the gain); a
    note or a skipped measurement gives '-', the paper's ratios its measured 9.2x and 5.7x."""
    text = bench_paper.paper_table(paper_columns(), MODEL, "NVIDIA H200")
    table = table_lines(text, "Standard over FlashAttention")
    assert table[0].split() == ["standard", "/", "column", "yours", "(09)", "reference", "(09)", "yours", "(14)",
                                "reference", "(14)", "paper", "A100"]
    assert row(table, "HBM R/W, model")[-5:] == ["6.6", "6.6", "9.3", "9.3", "-"]
    assert row(table, "HBM R/W, measured")[-5:] == ["-", "-", "-", "25.0", "9.2"]
    assert row(table, "runtime")[-5:] == ["-", "10.0", "-", "10.0", "5.7"]
    assert row(table, "peak memory")[-5:] == ["-", "5.0", "-", "5.0", "-"]


def test_paper_columns_compare_with_their_exercises_standard():
    assert bench_paper.baseline("yours (09)") == bench_paper.baseline("reference (09)") == bench_paper.STANDARD
    assert bench_paper.baseline("yours (14)") == bench_paper.baseline("reference (14)") == bench_paper.STANDARD_DROPOUT


def test_paper_model_reads_the_closed_forms_of_05_and_08():
    """05's and 08's closed forms, and standard attention's dropout kernels: 6n² elements of 2 bytes
    for each of 64 x 16 heads, 12.9 GB; FlashAttention moves none more, so one figure serves both."""
    gb = bench_paper.paper_model_gb()
    assert set(gb) == {bench_paper.STANDARD, bench_paper.STANDARD_DROPOUT, "flash"}
    assert 25 < gb[bench_paper.STANDARD] < 45 and 2 < gb["flash"] < 8  # the paper measured 40.3 and 4.4
    dropout = 6 * 1024 * 1024 * 2 * 64 * 16 / 1e9
    assert gb[bench_paper.STANDARD_DROPOUT] - gb[bench_paper.STANDARD] == pytest.approx(dropout, rel=1e-12)


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
