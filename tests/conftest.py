"""Shared fixtures: tests never reach the network, and never touch the user's HOME."""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from allowed_skips import allowed_skip  # tests/ is on the path: this file's folder

# tensorflow is in the dev extra (a writer and reference reader of SavedModel, TF checkpoints and
# TFLite); transformers must not start importing it for every PyTorch model, nor TF log to stderr.
os.environ.setdefault("USE_TF", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# transformers 5's save_pretrained draws a "Writing model shards" bar on stderr: tests that read the
# tool's stderr must see only the tool (the bar honours huggingface_hub's switch, read at import)
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# the environments targets run in (guard.envs): the checkout's own, as `make test` sets them (.envs)
os.environ.setdefault("CKPT_GUARD_HOME", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                      ".envs"))

# `make test` installs every extra; a missing one is a broken set-up, never a reason to skip
# (the per-file importorskip calls keep single files runnable in a partial environment).
_REQUIRED = ("numpy", "ml_dtypes", "torch", "jax", "flax", "safetensors", "msgpack", "transformers",
             "huggingface_hub", "starlette", "uvicorn", "httpx", "hypothesis", "jsonschema", "tensorflow",
             "openvino", "coremltools", "executorch", "tflite", "ai_edge_litert", "onnx", "onnxruntime", "h5py",
             "gguf", "diffusers", "tensorstore", "flatbuffers", "keras",
             # the training frameworks that write the training-state checkpoints (DeepSpeed, Megatron-core,
             # Accelerate's FSDP, Orbax)
             "deepspeed", "megatron.core", "accelerate", "orbax.checkpoint",
             # the quantizers that write the quantized layouts and dequantize them for reference
             "bitsandbytes", "hqq", "optimum.quanto", "compressed_tensors", "torchao")


def strict_skips() -> bool:
    """Whether a skip off tests/allowed_skips.py fails: always, unless CKPT_GUARD_PARTIAL_ENV=1 says the
    environment is partial by choice (CI=true and CKPT_GUARD_STRICT_SKIPS=1 overrule that)."""
    return (os.environ.get("CKPT_GUARD_PARTIAL_ENV") != "1" or os.environ.get("CI") == "true"
            or os.environ.get("CKPT_GUARD_STRICT_SKIPS") == "1")


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _fail_a_missing_environment(report: pytest.CollectReport | pytest.TestReport) -> None:
    """A skip for anything `make test` provides is a test that cannot fail: it fails instead."""
    if report.skipped and not hasattr(report, "wasxfail") and strict_skips():
        reason = _skip_reason(report)
        if not allowed_skip(reason):
            report.outcome = "failed"
            report.longrepr = (f"skipped, and skips are strict here: {reason}\n(`make test` provides every "
                               "dependency and environment; only tests/allowed_skips.py's reasons may skip; "
                               "CKPT_GUARD_PARTIAL_ENV=1 lets a partial environment skip)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    _fail_a_missing_environment(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield  # a module-level importorskip or skip(allow_module_level=True)
    _fail_a_missing_environment(outcome.get_result())


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The run ends with how many tests skipped, and why."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if not hasattr(r, "wasxfail")]
    reasons: dict[str, int] = {}
    for report in skipped:
        reason = _skip_reason(report)
        reasons[reason] = reasons.get(reason, 0) + 1
    terminalreporter.write_line(f"{len(skipped)} skipped" + (":" if reasons else ""))
    for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"  {count} x {reason}")


# CI has 24 GiB: a test whose process outgrows this is stopped with its name, not OOM-killed unnamed
RSS_LIMIT = int(os.environ.get("CKPT_GUARD_TEST_RSS_LIMIT", str(16 * 2**30)))
_current_test = ["(collection)"]


def _rss_watchdog(config: pytest.Config) -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    while True:
        time.sleep(0.5)
        try:
            with open("/proc/self/statm", "rb") as fh:
                rss = int(fh.read().split()[1]) * page
        except OSError:
            return  # not Linux: no watchdog
        if rss > RSS_LIMIT:
            capture = config.pluginmanager.getplugin("capturemanager")
            if capture is not None:  # the message must reach the real stderr, not the test's captured one
                capture.suspend_global_capture(in_=False)
            sys.stderr.write(f"\n{_current_test[0]}: the test process passed {rss / 2**30:.1f} GiB resident "
                             f"(limit {RSS_LIMIT / 2**30:.1f} GiB, CKPT_GUARD_TEST_RSS_LIMIT); stopped\n")
            sys.stderr.flush()
            os._exit(3)


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _current_test[0] = nodeid


def pytest_configure(config: pytest.Config) -> None:
    threading.Thread(target=_rss_watchdog, args=(config,), name="rss-watchdog", daemon=True).start()
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


# Python's own recursion limit, as a `ckpt-guard` process runs with it.  coremltools raises it to 5000 when
# its TensorFlow frontend is imported, and tests that import coremltools share this process: the hostile-
# nesting tests (a 2,000-deep safetensors header is "nested too deeply") must not depend on their order.
_RECURSION_LIMIT = sys.getrecursionlimit()


@pytest.fixture(autouse=True)
def _default_recursion_limit() -> Iterator[None]:
    sys.setrecursionlimit(_RECURSION_LIMIT)
    yield
    sys.setrecursionlimit(_RECURSION_LIMIT)


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A plain `pytest` under transformers 5 leaves the transformers-4 tests to `.venv-tf4`, saying so
    (`make test` selects them there with -m transformers4; they are never skipped by it)."""
    if config.option.markexpr:
        return
    try:
        import importlib.metadata

        major = int(importlib.metadata.version("transformers").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return
    if major < 5:
        return
    moved = pytest.mark.skip(reason="needs transformers 4's Flax/TF classes: `make test` runs it in .venv-tf4 "
                                    "(.venv-tf4/bin/python -m pytest -m transformers4)")
    for item in items:
        if item.get_closest_marker("transformers4") is not None:
            item.add_marker(moved)
