"""The test bounds themselves: a loop is stopped, and a failing block leaves no tracing behind."""

from __future__ import annotations

import tracemalloc

import pytest
from bounds import ScanHang, no_hang, traced


def test_a_loop_is_stopped_and_the_alarm_is_cleared() -> None:
    with pytest.raises(ScanHang), no_hang(0.2):
        while True:
            pass
    with no_hang(0.2):
        pass  # an earlier alarm must not fire here


def test_a_failing_block_stops_tracing_and_the_next_peak_starts_from_nothing() -> None:
    with pytest.raises(AssertionError), traced():
        big = bytearray(32 * 1024 * 1024)
        assert not big  # fails while tracing, as a broken reader test would
    assert not tracemalloc.is_tracing()
    tracemalloc.start()  # left on by someone else
    _left = bytearray(32 * 1024 * 1024)
    del _left
    with traced() as peak:
        small = bytearray(1024)
    assert 1024 <= peak.bytes < 1024 * 1024, peak.bytes
    assert small is not None and not tracemalloc.is_tracing()
