import numpy as np
import pytest

from radixserve.memory import OutOfRows, ReqToTokenTable


def test_rows_are_written_and_read_back():
    table = ReqToTokenTable(4, 32)
    row = table.alloc()
    table.write(row, 0, [5, 6, 7])
    table.write(row, 3, np.array([9, 10]))
    assert table.read(row, 5).tolist() == [5, 6, 7, 9, 10]
    assert table.read(row, 5, start=3).tolist() == [9, 10]


def test_rows_are_distinct_and_run_out():
    table = ReqToTokenTable(2, 8)
    rows = {table.alloc(), table.alloc()}
    assert rows == {0, 1}
    with pytest.raises(OutOfRows):
        table.alloc()
    table.free(0)
    assert table.alloc() == 0


def test_bad_rows_and_ranges():
    table = ReqToTokenTable(2, 8)
    with pytest.raises(ValueError):
        table.write(0, 0, [1])  # row not allocated
    row = table.alloc()
    with pytest.raises(ValueError, match="context window"):
        table.write(row, 6, [1, 2, 3])
    with pytest.raises(ValueError):
        table.read(row, 9)
    table.free(row)
    with pytest.raises(ValueError):
        table.free(row)
