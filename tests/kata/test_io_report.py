"""Tests for kata/tools/io_report.py, the IO tables the grader prints once exercises 05 and 08 pass."""
from types import SimpleNamespace

import numpy as np
import pytest

from kata.given.hbm import HBM, blocks
from kata.grader import commands
from kata.exercises import SOLUTIONS_DIR, find, load
from kata.tools.io_report import sparse_table, standard_dropout_io, table, training_table

WIDTH = 80  # a terminal's columns


def solved(number):
    return lambda: load(find(number), SOLUTIONS_DIR)


def test_table_uses_the_closed_forms_and_names_the_paper():
    """The numbers are the solution's closed forms at n = 1k, 4k, 16k, d = 64, blocks of 128."""
    text = table(load(find("05"), SOLUTIONS_DIR))
    # n = 1024, T_r = 8: standard reads 2n² + nd + 2·T_r·nd, writes 2n² + nd; flash nd + 2·T_r·nd, nd + n.
    assert "3,211,264" in text and "2,162,688" in text and "1,114,112" in text and "66,560" in text
    # n = 16384, T_r = 128: standard reads 2·2^28 + 2^20 + 2·128·2^20.
    assert "806,354,944" in text
    # GPT-2 medium forward: elements x 2 bytes x 16 heads x batch 64.
    assert "standard 11.0 GB, FlashAttention 2.4 GB, 4.6x (1.5 GB causal" in text
    assert "40.3 GB" in text and "4.4 GB" in text and "forward AND backward" in text
    assert "block_q = block_k = 128" in text and "leaves out: the backward pass" in text
    # Algorithm 3 reads P, dP and dS; S is gone by then.
    assert "reads P,\n  dP and dS and writes dP and dS" in text and "S and P again" not in text
    assert max(map(len, text.splitlines())) <= WIDTH


def test_training_table_adds_the_backward_from_the_closed_forms():
    """Backward counts from 08's solution, GPT-2 medium forward + backward from 05's and 08's, beside
    the paper's 40.3 GB and 4.4 GB, in 80 columns."""
    text = training_table(solved("05"), solved("08"))
    # n = 1024, T_r = T_c = 8: standard reads 5n² + nd + 2·T_r·nd + 2·T_c·nd, writes 2n² + 3nd;
    # flash reads 4nd + T_c·(3nd + 2n), writes n + T_c·nd + 2nd.
    assert "7,405,568" in text and "2,293,760" in text and "1,851,392" in text and "656,384" in text
    # n = 16384, T = 128: standard reads 5·2^28 + 2^20 + 4·128·2^20.
    assert "1,880,096,768" in text
    # One head's elements x 2 bytes x 16 heads x batch 64 (GB = 1e9 B): 5,373,952 + 9,699,328 for
    # standard, 1,180,672 + 2,507,776 for flash; causal flash 721,920 + 1,583,104 (R = 4608 rows).
    rows = {line[:26].strip(): line[26:].split() for line in text.splitlines()}
    assert rows["forward"] == ["11.0", "GB", "2.4", "GB", "4.6x"]
    assert rows["backward"] == ["19.9", "GB", "5.1", "GB", "3.9x"]
    assert rows["forward + backward"] == ["30.9", "GB", "7.6", "GB", "4.1x"]
    assert rows["forward + backward, causal"] == ["30.9", "GB", "4.7", "GB", "6.5x"]
    # Dropout adds 6n² = 6,291,456 elements to standard attention's 15,073,280 (12.9 GB), none to flash's.
    assert rows["the same, with dropout"] == ["43.8", "GB", "4.7", "GB", "9.3x"]
    assert rows["paper, measured (A100)"] == ["40.3", "GB", "4.4", "GB", "9.2x"]
    for words in ("dropout", "mask", "L2 cache", "Figure 2", "block_q = block_k = 128"):
        assert words in text
    assert max(map(len, text.splitlines())) <= WIDTH


def test_standard_dropout_io_is_what_its_kernels_move():
    """Standard attention's dropout kernels run on the simulator, a block of full rows at a time: the
    forward reads P and writes the dropped P and the keep mask, the backward reads the dropped P's
    gradient and the mask and writes dP. A count without the mask (written, or read back in the
    backward), or without the backward's kernel, differs."""
    n, block_q, p = 13, 4, 0.25
    rng = np.random.default_rng(0)
    weights, grad_dropped, keep = rng.random((n, n)), rng.standard_normal((n, n)), rng.random((n, n)) >= p
    hbm = HBM(capacity=3 * block_q * n)  # three row blocks of n x n arrays live at once
    hbm.put("P", weights)
    hbm.put("dP_dropped", grad_dropped)
    for name in ("P_dropped", "dP"):
        hbm.put(name, np.full((n, n), np.nan))  # poisoned: an element never written stays NaN
    hbm.zeros("mask", (n, n), bool)
    moved = {}
    for name, source, target in (("forward", "P", "P_dropped"), ("backward", "dP_dropped", "dP")):
        before = hbm.reads, hbm.writes
        for rows in blocks(n, block_q):
            with hbm.on_chip():
                if name == "forward":
                    hbm.write("mask", rows, value=keep[rows])
                    mask = keep[rows]
                else:
                    mask = hbm.read("mask", rows)
                hbm.write(target, rows, value=np.where(mask, hbm.read(source, rows) / (1 - p), 0.0))
        moved[name] = (hbm.reads - before[0], hbm.writes - before[1])
    np.testing.assert_array_equal(hbm.array("P_dropped"), np.where(keep, weights / (1 - p), 0.0))
    np.testing.assert_array_equal(hbm.array("dP"), np.where(keep, grad_dropped / (1 - p), 0.0))
    assert moved == standard_dropout_io(n), f"simulated {moved}, standard_dropout_io({n}) says {standard_dropout_io(n)}"


def test_table_reports_a_closed_form_that_raises():
    """An unfinished closed form gives a one-line reason, not a traceback in the grader's report."""
    def unfinished(*args, **kwargs):
        raise NotImplementedError("flash_attention_io: replace this line with your code")

    module = SimpleNamespace(standard_attention_io=lambda n, d, bq, bk, causal=False: (1, 1),
                             flash_attention_io=unfinished)
    text = table(module)
    assert text.startswith("IO table skipped: your closed forms raised NotImplementedError: flash_attention_io")
    assert "\n" in text and "Traceback" not in text


def test_training_table_reports_an_unfinished_05_or_a_missing_file():
    """`grader.py 08` alone loads 05 as it is: a stub or a missing file gives a reason, not a crash."""
    def stub(*args, **kwargs):
        raise NotImplementedError("flash_attention_io: replace this line with your code")

    def unfinished():
        return SimpleNamespace(standard_attention_io=lambda *args, **kwargs: (1, 1), flash_attention_io=stub)

    def missing():
        raise FileNotFoundError("05_io_counting.py is missing")

    for forward, reason in ((unfinished, "NotImplementedError: flash_attention_io"),
                            (missing, "FileNotFoundError: 05_io_counting.py is missing")):
        text = training_table(forward, solved("08"))
        assert text.startswith(f"Forward + backward IO table skipped: {reason}"), text
        assert "Traceback" not in text and len(text.splitlines()) == 2


@pytest.mark.parametrize("outcomes, tables", [
    ({"05": True}, ["Elements moved by one head, forward"]),
    ({"08": True}, ["Backward: elements moved"]),  # `grader.py 08`: 05 not run
    ({"05": True, "08": True}, ["Elements moved by one head, forward", "Backward: elements moved"]),
    ({"05": False, "08": True}, []),  # 05's closed forms are not to be trusted yet
    ({"05": True, "08": False}, ["Elements moved by one head, forward"]),
], ids=["05", "08-alone", "both", "05-failing", "08-failing"])
def test_grader_prints_the_tables_of_the_exercises_passed(capsys, outcomes, tables):
    """The backward table shown while 05 fails, or the forward one lost once 08 passes."""
    results = [SimpleNamespace(ok=ok, exercise=find(number)) for number, ok in outcomes.items()]
    commands._io_table(results, SOLUTIONS_DIR)
    out = capsys.readouterr().out
    assert [t for t in ("Elements moved by one head, forward", "Backward: elements moved") if t in out] == tables


def test_sparse_table_at_64k_from_the_closed_form():
    """Exercise 12's table: dense reads nd + 2·T_r·nd at n = 64k (T_r = 512), causal about half,
    every mask with the same writes nd + n, in 80 columns."""
    text = sparse_table(solved("12")())
    rows = {line[:16].strip(): line[16:].split() for line in text.splitlines()}
    assert rows["dense"][:3] == ["1.0000", "4,299,161,600", "4,259,840"]
    assert rows["causal"][0] == "0.5010" and rows["window 1k"][-1].endswith("x")
    assert "Proposition 4" in text and max(map(len, text.splitlines())) <= WIDTH
    broken = SimpleNamespace(block_lists=solved("12")().block_lists, density=lambda bm: 1.0,
                             block_sparse_io=lambda *a: (_ for _ in ()).throw(NotImplementedError("stub")))
    assert sparse_table(broken).startswith("Block-sparse table skipped: NotImplementedError: stub")
