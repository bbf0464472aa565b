"""`make fuzz`: run every atheris target for a bounded time and print the figures.

    FUZZ_SECONDS=60 make fuzz            # each target, one after the other
    .venv/bin/python fuzz/run.py --seconds 300 safetensors

New interesting inputs go to a scratch folder (the committed seed corpus is not
touched); a crash, hang or memory blow-up is saved under fuzz/regressions/<target>/,
which tests/test_fuzz_corpus.py replays from then on.  Exit status 1 if any target crashed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGETS = ("safetensors", "torch_zip", "torch_legacy", "torchscript", "torch_export", "flax_msgpack", "torch_pickle",
           "gguf", "onnx", "npy", "npz", "hdf5", "keras", "orbax_metadata", "openvino", "coreml", "coreml_spec",
           "tf_bundle", "tflite", "executorch", "dcp_metadata", "zero_states")


def run_target(target: str, seconds: int) -> tuple[int, int, int]:
    """(inputs tried, coverage, exit status) of one bounded run."""
    regressions = HERE / "regressions" / target
    regressions.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{target}-") as scratch:
        cmd = [sys.executable, str(HERE / f"fuzz_{target}.py"), scratch, str(HERE / "corpus" / target),
               str(regressions),
               f"-max_total_time={seconds}", "-timeout=5", "-rss_limit_mb=2048", "-max_len=65536",
               f"-artifact_prefix={regressions}/", "-print_final_stats=1"]
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    log = proc.stdout + proc.stderr
    runs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", log) or re.findall(r"Done (\d+) runs", log)
    cov = re.findall(r"cov: (\d+)", log)
    if proc.returncode:
        print(log[-3000:], file=sys.stderr)
    return int(runs[-1]) if runs else 0, int(cov[-1]) if cov else 0, proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("targets", nargs="*", default=list(TARGETS))
    args = parser.parse_args(argv)
    failed = 0
    print(f"{'target':<14}{'seconds':>8}{'inputs':>12}{'coverage':>10}  result")
    for target in args.targets:
        start = time.monotonic()
        runs, cov, status = run_target(target, args.seconds)
        failed |= status != 0
        verdict = "ok" if status == 0 else f"CRASH (exit {status}): see fuzz/regressions/{target}/"
        print(f"{target:<14}{time.monotonic() - start:>8.0f}{runs:>12,}{cov:>10,}  {verdict}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
