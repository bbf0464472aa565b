"""Shared fixtures: tests never reach the network, and never touch the user's HOME."""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import socket
from collections.abc import Iterator

import pytest

# `make test` installs every extra; a missing one is a broken set-up, never a reason to skip
# (the per-file importorskip calls keep single files runnable in a partial environment).
_REQUIRED = ("numpy", "ml_dtypes", "torch", "jax", "flax", "safetensors", "msgpack", "transformers",
             "huggingface_hub", "starlette", "uvicorn", "httpx", "hypothesis", "jsonschema")


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("CKPT_GUARD_PARTIAL_ENV") == "1":
        return
    missing = [name for name in _REQUIRED if importlib.util.find_spec(name) is None]
    if missing:
        raise pytest.UsageError(
            f"missing test dependencies: {', '.join(missing)}; run `make test` "
            "(or set CKPT_GUARD_PARTIAL_ENV=1 to skip what needs them)"
        )


_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _is_loopback(address: object) -> bool:
    if not isinstance(address, tuple) or not address:
        return True  # AF_UNIX paths and the like
    host = address[0]
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _guarded_connect(self: socket.socket, address: object) -> None:
    if not _is_loopback(address):
        raise ConnectionRefusedError(f"tests may not reach the network (tried {address!r})")
    return _real_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: object) -> int:
    if not _is_loopback(address):
        raise ConnectionRefusedError(f"tests may not reach the network (tried {address!r})")
    return _real_connect_ex(self, address)


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect)
    monkeypatch.setattr(socket.socket, "connect_ex", _guarded_connect_ex)
    yield


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
