"""A real PostgreSQL server for the queue tests, started by the test session itself.

Debian's ``postgresql`` package (``make test`` installs it) provides ``initdb``
and ``pg_ctl`` under ``/usr/lib/postgresql/<version>/bin``.  The server runs
from a fresh directory, listens on a unix socket only, trusts local
connections and skips fsync (a test server).  PostgreSQL refuses to run as
root, so under root it runs as the ``postgres`` account (or ``nobody``).  Each
test gets its own database.  A missing server fails the run unless
``CKPT_GUARD_PARTIAL_ENV=1`` (the policy of ``conftest.py``).
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

SUPERUSER = "ckpt"
_numbers = itertools.count()


def missing(what: str) -> None:
    if os.environ.get("CKPT_GUARD_PARTIAL_ENV") == "1":
        pytest.skip(what)
    pytest.fail(f"{what}; install Debian's `postgresql` package (`apt-get install -y postgresql`, as `make test` "
                "does) or set CKPT_GUARD_PARTIAL_ENV=1 to skip the PostgreSQL tests", pytrace=False)


def server_bindir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                      key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    return Path(versions[-1]).parent if versions else None


class PostgresServer:
    def __init__(self) -> None:
        bindir = server_bindir()
        if bindir is None:
            missing("PostgreSQL server binaries (initdb, pg_ctl) not found")
        self.bindir = bindir
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = next((u for u in ("postgres", "nobody") if _has_user(u)), None)
            if self.user is None:
                missing("running as root, with no `postgres` or `nobody` account to run PostgreSQL as")
        # Not under pytest's tmp_path: that is private to root, and the server runs as another user.
        self.root = Path(tempfile.mkdtemp(prefix="ckpt-guard-pg-"))
        self.data = self.root / "data"
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bindir / args[0]), *args[1:]], user=self.user, capture_output=True,
                              text=True, timeout=120, cwd=self.root)

    def start(self) -> PostgresServer:
        init = self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8",
                         "--no-sync", "--no-instructions")
        if init.returncode != 0:
            missing(f"initdb failed: {init.stderr.strip()[-400:]}")
        options = (f"-k {self.root} -c listen_addresses='' -c fsync=off -c synchronous_commit=off "
                   "-c full_page_writes=off -c max_connections=50")
        started = self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w",
                            "start")
        if started.returncode != 0:
            log = (self.root / "log").read_text(errors="replace") if (self.root / "log").exists() else ""
            missing(f"pg_ctl start failed: {(started.stderr + log).strip()[-400:]}")
        return self

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@/{database}?host={self.root}"

    def new_database(self) -> str:
        import psycopg

        name = f"t{os.getpid()}_{next(_numbers)}"
        with psycopg.connect(self.url(), autocommit=True) as db:
            db.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        missing("psycopg is not installed (the `postgres` extra)")
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A fresh, empty database on the session's server."""
    return postgres_server.new_database()
