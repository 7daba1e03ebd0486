"""Tests for kata/given/hbm.py, the simulated GPU memory that exercise 05 counts transfers with."""
import numpy as np
import pytest

from kata.given.hbm import HBM, CapacityError, Transfer


@pytest.fixture
def hbm():
    memory = HBM()
    memory.put("K", np.arange(24.0).reshape(6, 4))
    memory.put("L", np.arange(6.0))
    return memory


def test_put_stores_a_copy_and_setup_is_not_counted(hbm):
    """Setting up arrays costs nothing, and the caller's array cannot change what HBM holds."""
    q = np.ones((3, 2))
    hbm.put("Q", q)
    q[:] = 7
    hbm.zeros("O", (3, 2))
    assert (hbm.array("Q") == 1).all() and (hbm.array("O") == 0).all()
    assert hbm.shape("O") == (3, 2)
    assert (hbm.reads, hbm.writes, hbm.log) == (0, 0, [])


def test_read_returns_a_copy_and_counts_its_elements(hbm):
    """A read counts rows x cols elements, per array and in total, and its result is the learner's own."""
    with hbm.on_chip():
        tile = hbm.read("K", slice(1, 3), range(0, 3))
        hbm.read("L", slice(None))
    np.testing.assert_array_equal(tile, [[4, 5, 6], [8, 9, 10]])
    tile[:] = -1
    assert hbm.array("K")[1, 0] == 4
    assert (hbm.reads, hbm.reads_of("K"), hbm.reads_of("L"), hbm.writes) == (12, 6, 6, 0)
    assert hbm.log == [Transfer("read", "K", (1, 3), (0, 3), 6), Transfer("read", "L", (0, 6), None, 6)]


def test_cols_default_to_every_column(hbm):
    with hbm.on_chip():
        assert hbm.read("K", slice(4, None)).shape == (2, 4)
    assert hbm.log[-1] == Transfer("read", "K", (4, 6), (0, 4), 8)


def test_write_counts_and_stores(hbm):
    """Writes land in the region and count their elements; 1-D arrays take rows only."""
    hbm.write("K", slice(0, 2), slice(2, 4), np.full((2, 2), -1.0))
    hbm.write("L", range(3, 5), value=[10.0, 11.0])
    np.testing.assert_array_equal(hbm.array("K")[:2, 2:], -1)
    np.testing.assert_array_equal(hbm.array("L")[3:5], [10, 11])
    assert (hbm.writes, hbm.writes_of("K"), hbm.writes_of("L"), hbm.reads) == (6, 4, 2, 0)
    assert hbm.log[-1] == Transfer("write", "L", (3, 5), None, 2)


def test_array_is_an_uncounted_copy(hbm):
    hbm.array("K")[:] = 0
    assert hbm.array("K")[5, 3] == 23 and hbm.reads == 0


def test_write_of_the_wrong_shape_is_refused(hbm):
    """No broadcasting: a value must have exactly the region's shape."""
    with pytest.raises(ValueError, match=r"K\[0:2, 0:4\]: the region has shape \(2, 4\), the value has shape \(4,\)"):
        hbm.write("K", slice(0, 2), value=np.zeros(4))
    with pytest.raises(TypeError, match="needs a value"):
        hbm.write("K", slice(0, 2))
    assert hbm.writes == 0


def test_unknown_name_lists_the_known_ones(hbm):
    with pytest.raises(KeyError, match="no array 'S' in HBM; its arrays are: K, L"):
        hbm.write("S", slice(0, 1), value=np.zeros((1, 1)))
    with pytest.raises(KeyError, match="its arrays are: none yet"):
        HBM().reads_of("Q")


@pytest.mark.parametrize("rows, cols, message", [
    (slice(4, 8), None, r"rows 4:8 of K lie outside 0:6: cut the last block"),
    (slice(0, 2), slice(3, 5), r"cols 3:5 of K lie outside 0:4"),
    (slice(-2, None), None, r"rows -2:6 of K lie outside 0:6"),
    (slice(3, 1), None, r"rows 3:1 of K lie outside"),
], ids=["rows-past-end", "cols-past-end", "negative", "backwards"])
def test_regions_outside_the_array_are_refused(hbm, rows, cols, message):
    """No silent clipping as NumPy would do: a ragged last block must be cut by the caller."""
    with hbm.on_chip(), pytest.raises(IndexError, match=message):
        hbm.read("K", rows, cols)
    assert hbm.reads == 0


@pytest.mark.parametrize("rows, cols, error, message", [
    (2, None, TypeError, r"rows of K must be a slice or a range"),
    (slice(0, 4, 2), None, ValueError, r"contiguous \(step 1\); got step 2"),
    (slice(0, 2), [0, 1], TypeError, r"cols of K must be a slice or a range"),
], ids=["int", "step", "list"])
def test_regions_must_be_contiguous_slices(hbm, rows, cols, error, message):
    with hbm.on_chip(), pytest.raises(error, match=message):
        hbm.read("K", rows, cols)


def test_a_1d_array_takes_rows_only(hbm):
    with hbm.on_chip(), pytest.raises(IndexError, match=r"L is 1-D \(6,\): give rows only"):
        hbm.read("L", slice(0, 2), slice(0, 1))


def test_a_read_must_sit_in_an_on_chip_block(hbm):
    """Where data lives on chip is the lesson: a read outside any block is refused, not ignored."""
    with pytest.raises(RuntimeError, match=r"K\[0:1, 0:4\] outside an on-chip block"):
        hbm.read("K", slice(0, 1))


def test_reads_stay_live_until_their_block_ends():
    """Nested blocks: the outer read stays live through the inner ones; the peak is remembered."""
    hbm = HBM(capacity=20)
    hbm.zeros("Q", (8, 4))
    with hbm.on_chip():
        hbm.read("Q", slice(0, 2))  # 8 live for the whole block
        for start in range(0, 8, 2):
            with hbm.on_chip():
                hbm.read("Q", slice(start, start + 2))
                hbm.read("Q", slice(start, start + 1))
                assert hbm.on_chip_now == 20
            assert hbm.on_chip_now == 8
    assert (hbm.on_chip_now, hbm.peak_on_chip) == (0, 20)


def test_capacity_error_names_capacity_live_data_and_the_load():
    """Keeping every tile live overflows SRAM, and the message says by how much and what to do."""
    hbm = HBM(capacity=20)
    hbm.zeros("K", (8, 4))
    with hbm.on_chip():
        hbm.read("K", slice(0, 2))
        hbm.read("K", slice(2, 4))
        with pytest.raises(CapacityError, match=r"moving K\[4:6, 0:4\] \(8 elements\) with 16 elements "
                                                r"already live on chip needs 24, but the capacity is 20"):
            hbm.read("K", slice(4, 6))
    assert (hbm.reads, hbm.on_chip_now, hbm.peak_on_chip) == (16, 0, 16)


def test_a_block_releases_its_data_even_when_it_raises():
    hbm = HBM(capacity=8)
    hbm.zeros("K", (8, 4))
    with pytest.raises(ZeroDivisionError), hbm.on_chip():
        hbm.read("K", slice(0, 2))
        1 / 0
    with hbm.on_chip():
        hbm.read("K", slice(2, 4))
    assert hbm.on_chip_now == 0


def test_a_written_value_is_live_during_its_write():
    """Writing a whole matrix at once needs it all on chip: too big for a small SRAM."""
    hbm = HBM(capacity=12)
    hbm.zeros("Q", (2, 4))
    hbm.zeros("O", (4, 4))
    with hbm.on_chip():
        hbm.read("Q", slice(0, 1))
        hbm.write("O", slice(0, 2), value=np.ones((2, 4)))
        with pytest.raises(CapacityError, match=r"moving O\[0:4, 0:4\] \(16 elements\) with 4 elements"):
            hbm.write("O", slice(None), value=np.ones((4, 4)))
    assert (hbm.writes, hbm.peak_on_chip) == (8, 12)


def test_only_1d_and_2d_arrays(hbm):
    with pytest.raises(ValueError, match=r"1-D and 2-D arrays; X has shape \(2, 2, 2\)"):
        hbm.put("X", np.zeros((2, 2, 2)))


def test_repr_summarises_arrays_and_counts(hbm):
    with hbm.on_chip():
        hbm.read("L", slice(0, 3))
    assert repr(hbm) == "HBM(K (6, 4), L (6,); reads 3, writes 0, peak on chip 3)"
