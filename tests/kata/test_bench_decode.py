"""The decoding benchmark's arithmetic and its table, on made-up timings (the timing needs a GPU)."""
from kata.bench.decode import FA06, REFERENCE, SDPA, YOURS, fraction, kv_bytes, report, speedup, summary

COPY = 4000.0  # GB/s
NAMES = [YOURS, REFERENCE, SDPA]


def rows():
    """B = 1 at 32k and 128k keys, B = 64 at 128k too big for 06's 4x expanded K/V."""
    out = []
    for B, n_k, ms in ((1, 32768, 0.0400), (1, 131072, 0.1500), (64, 131072, 9.0)):
        b = kv_bytes(B, n_k)
        out.append({"B": B, "n_k": n_k, "bytes": b, YOURS: {"note": "not started"},
                    REFERENCE: {"ms": ms}, SDPA: {"ms": 2 * ms},
                    FA06: {"ms": 5 * ms} if B == 1 else {"note": "no room x4"}})
    return out


def test_kv_bytes_count_k_and_v_of_the_kv_heads_only():
    """K and V of 8 kv heads at D = 128 in bf16: 4 KiB per key, not 32 query heads' worth."""
    assert kv_bytes(1, 32768) == 2 * 8 * 32768 * 128 * 2 == 128 * 2**20


def test_fraction_of_copy_bandwidth():
    """134 MB in 0.04 ms is 3355 GB/s: 84% of a 4000 GB/s copy; a cell without a time has none."""
    r = rows()
    assert abs(fraction(r[0], REFERENCE, COPY) - kv_bytes(1, 32768) / 0.04e-3 / 1e9 / COPY) < 1e-12
    assert round(fraction(r[0], REFERENCE, COPY), 3) == 0.839
    assert fraction(r[0], YOURS, COPY) is None


def test_speedup_is_their_time_over_ours():
    """An inverted ratio would call a 5x faster kernel 0.2x."""
    r = rows()
    assert speedup(r[0], REFERENCE, FA06) == 5.0
    assert speedup(r[2], REFERENCE, FA06) is None


def test_summary_takes_the_worst_long_cell_at_batch_1():
    """B = 64 cells and short caches stay out of the target lines; the worst cell is reported."""
    lines = summary(rows(), REFERENCE, COPY)
    worst = kv_bytes(1, 131072) / 0.15e-3 / 1e9 / COPY  # 0.895 > 0.839: 32k is the worst
    assert worst > fraction(rows()[0], REFERENCE, COPY)
    assert "84% of copy bandwidth (worst of 2 cells; reference target 70%)" in lines[0]
    assert "5.0x 06's kernel speed (worst of 2 cells; reference target 3x)" in lines[1]


def test_report_fits_100_columns_and_names_its_baselines():
    text = report(rows(), NAMES, COPY, "SDPA with enable_gqa=True")
    assert max(map(len, text.splitlines())) <= 100
    assert "SDPA with enable_gqa=True" in text and "06's reference on K/V repeated to 32 heads" in text
    assert "not started" in text and "no room x4" in text
    assert "yours at B = 1" not in text  # an unfinished kernel gets no target line, but a note
    assert "yours: no cell at B = 1, n_k >= 32768 was measured" in text
    assert "reference at B = 1, n_k >= 32768: 84% of copy bandwidth" in text
