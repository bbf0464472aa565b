"""Kill tests: SIGKILL a real `ckpt-guard hub webhook` with deliveries pending; every push answered once.

The service kills itself at a named point (``CKPT_GUARD_KILL_AT``): before a
delivery is enqueued (the sender gets no 202 and delivers again, as the Hub
does), after it, in the middle of a review, and after an answer was posted
but before its job was marked done.  A replacement starts on the same port
and state.  On SQLite with one replica, and on a real PostgreSQL server with
two replicas sharing the database, the first of which is killed.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from hub_delivery import kill_scenario  # noqa: E402
from hub_postgres import postgres_server, postgres_url  # noqa: E402,F401 - fixtures
from hub_standin import StandinHub  # noqa: E402

# (point, which occurrence): always reached within 50 deliveries, with work on both sides of it.
KILL_POINTS = [("before-enqueue", 20), ("after-enqueue", 20), ("mid-scan", 10), ("after-answer", 10)]


@pytest.fixture
def hub() -> Iterator[StandinHub]:
    with StandinHub() as standin:
        yield standin


def check(figures: dict[str, object]) -> None:
    assert figures["killed_by"] == signal.SIGKILL
    assert (figures["sent"], figures["answered"], figures["answered_twice"], figures["lost"]) == (50, 50, 0, 0), \
        figures


@pytest.mark.slow
@pytest.mark.parametrize("point, at", KILL_POINTS, ids=[p for p, _ in KILL_POINTS])
def test_kill_one_replica_on_sqlite(hub: StandinHub, tmp_path: Path, point: str, at: int) -> None:
    figures = kill_scenario(hub, tmp_path, state=str(tmp_path / "queue.sqlite3"), point=point, at=at)
    check(figures)
    if point == "before-enqueue":
        assert figures["unacknowledged"] >= 1  # the delivery that died with the process came again
    if point == "after-answer":
        assert figures["outcomes"].get("skipped", 0) >= 1  # the re-run found the answer on the Hub


@pytest.mark.slow
@pytest.mark.parametrize("point, at", KILL_POINTS, ids=[p for p, _ in KILL_POINTS])
def test_kill_one_of_two_replicas_on_postgres(hub: StandinHub, tmp_path: Path, postgres_url: str,  # noqa: F811
                                              point: str, at: int) -> None:
    check(kill_scenario(hub, tmp_path, state=postgres_url, point=point, at=at, replicas=2))
