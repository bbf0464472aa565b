"""Which environment a benchmark measures: the pinned development venv or the latest releases.

`make test` and the benchmarks run in `.venv`, pinned by guard/envs/constraints.txt; users get whatever
`pip install ckpt-guard[...]` resolves today.  `make bench-latest` builds `.venv-latest` the way
users install (`pip install ".[all]"`, no constraints; only torch pinned, to its CPU build) and runs
the benchmarks with its interpreter, so docs/benchmarks.md shows both.  A benchmark run by an
interpreter (or given one with ``--python``) measures that interpreter's environment: its numpy,
ml_dtypes, torch, and its installed ckpt-guard (or the tree's, where the benchmark puts it first
on PYTHONPATH).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LATEST_VENV = ROOT / ".venv-latest"
PACKAGES = ("numpy", "ml_dtypes", "safetensors", "torch", "transformers", "jax")


def versions(python: str = sys.executable) -> dict[str, str]:
    """The installed versions of the packages a scan or a conversion imports, as ``python`` sees them."""
    script = ("import importlib.metadata as m, json, sys\n"
              "out = {}\n"
              "for name in sys.argv[1:]:\n"
              "    try: out[name] = m.version(name)\n"
              "    except m.PackageNotFoundError: out[name] = '-'\n"
              "print(json.dumps(out))")
    done = subprocess.run([python, "-c", script, *PACKAGES], capture_output=True, text=True, check=True)
    versions: dict[str, str] = json.loads(done.stdout)
    return versions


def is_latest(python: str = sys.executable) -> bool:
    """True for the interpreter of `.venv-latest` (what `make bench-latest` builds)."""
    return Path(python).absolute().parent.parent == LATEST_VENV


def label(python: str = sys.executable) -> str:
    return "latest releases" if is_latest(python) else "pinned (constraints.txt)"


def describe(python: str = sys.executable) -> str:
    """One line: the environment's name and its versions."""
    found = versions(python)
    return f"{label(python)}: " + ", ".join(f"{name} {found[name]}" for name in PACKAGES)


def heading(base: str, python: str = sys.executable) -> str:
    """A docs section's heading for this environment (the latest releases get a section of their own)."""
    return f"{base} (latest releases)" if is_latest(python) else base


# ---- the managed environments (`ckpt-guard env install`): build time, size, a second install, a wheel's run


def managed_figures(cg: str) -> list[dict[str, object]]:
    """Each managed environment under CKPT_GUARD_HOME: its build time (its stamp's), size on disk, and the wall
    time of a second `env install` (a no-op) with ``cg``."""
    import time

    from guard.envs.find import find_managed
    from guard.envs.home import read_stamp, size_on_disk
    from guard.envs.registry import ENVIRONMENTS

    rows: list[dict[str, object]] = []
    for name, env in ENVIRONMENTS.items():
        found = find_managed(env)
        if found is None:
            rows.append({"name": name, "built": False})
            continue
        folder = Path(found.label)
        stamp = read_stamp(folder) or {}
        started = time.perf_counter()
        subprocess.run([cg, "env", "install", name], check=True, capture_output=True)
        rows.append({"name": name, "built": True, "kind": env.kind, "version": found.version,
                     "build_s": stamp.get("seconds"), "size_mb": round(size_on_disk(folder) / 1e6),
                     "second_install_s": round(time.perf_counter() - started, 2)})
    return rows


def keras_hub_wheel_vs_checkout(rounds: int = 3) -> dict[str, object]:
    """`parity --against keras-hub` on a tiny fp32 Qwen3, from the wheel (installed, not editable, into a fresh
    venv as tests/test_as_installed.py builds it, keras beside) and from the checkout's editable install, in
    alternating rounds: the median wall time of each."""
    import statistics
    import tempfile
    import time

    sys.path.insert(0, str(ROOT / "tests"))
    from test_as_installed import _link_closure, _venv, _wheel  # type: ignore[import-not-found]  # tests/, put on the path above: the same fresh venv the tests use
    from test_parity_against import save_tiny  # type: ignore[import-not-found]  # as above

    with tempfile.TemporaryDirectory(prefix="bench-envs-") as scratch:
        tmp = Path(scratch)
        _link_closure(tmp / "deps", ("parity",), also=("keras", "sentencepiece"))
        python = _venv(tmp / "venv", getattr(sys, "_base_executable", sys.executable), _wheel(tmp), tmp / "deps")
        src = save_tiny(tmp / "m", "qwen3", "float32")
        commands = {"wheel": str(python.parent / "ckpt-guard"), "checkout": str(ROOT / ".venv" / "bin" / "ckpt-guard")}
        times: dict[str, list[float]] = {k: [] for k in commands}
        for _ in range(rounds):
            for label_, cg in commands.items():
                started = time.perf_counter()
                subprocess.run([cg, "parity", str(src), "--against", "keras-hub", "-f", "json", "-o",
                                str(tmp / f"{label_}.json")], check=True, capture_output=True)
                times[label_].append(time.perf_counter() - started)
    figures: dict[str, object] = {k: round(statistics.median(v), 2) for k, v in times.items()}
    return figures | {"rounds": rounds}


def main(argv: list[str] | None = None) -> int:
    """python bench/envs.py [--no-keras-hub]: the figures of docs/benchmarks.md's "Managed environments"."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--no-keras-hub", action="store_true", help="skip the wheel-vs-checkout parity timing")
    args = parser.parse_args(argv)
    cg = str(ROOT / ".venv" / "bin" / "ckpt-guard")
    print(json.dumps({"managed": managed_figures(cg),
                      **({} if args.no_keras_hub else {"keras_hub_parity_s": keras_hub_wheel_vs_checkout()})},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
