"""Parity's fixed cost (issue 46): what makes `convert --parity` on a tiny model take seconds, not half a minute.

- JAX's persistent compilation cache, in ckpt-guard's folder of the user's cache directory
  (``$CKPT_GUARD_HOME/jax-cache``, else ``$XDG_CACHE_HOME/ckpt-guard/jax-cache``): made by the first run; a second
  run compiles nothing new (every program a hit), and its verdict and figures are the first run's, bit for bit.
- The Flax side's worker imports neither torch nor TensorFlow (transformers 4 imports both where installed): the
  parent sends the blocks of its PyTorch twin.
- The worker is started before the parent's own imports; one that is never asked (the configs disagree on the
  model type) is ended, not left behind.

Speed itself is measured in bench/parity_phases.py, not asserted here.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
from legacy_env import legacy_python  # noqa: E402

from guard.cli import main  # noqa: E402
from guard.parity import jax_cache  # noqa: E402

LLAMA = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
         "tie_word_embeddings": False}


def tiny_llama(directory: Path) -> Path:
    """A 107K-parameter Llama in bf16 (both passes of each side), saved by this transformers."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1 + 0.1 * torch.randn_like(param))
    model.to(torch.bfloat16).save_pretrained(directory)
    return directory


def convert_parity(src: Path, out: Path, report: Path, *extra: str) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    code = main(["convert", str(src), "--to", "flax", "--out", str(out), "--parity", "-f", "json", "-o", str(report),
                 *extra])
    data = json.loads(report.read_text())
    assert code == 0, data["findings"]
    return dict(data["extra"]["parity"])


def programs(folder: Path) -> set[str]:
    """The compiled programs JAX keeps (one ``*-cache`` file each; its ``*-atime`` files change on every hit)."""
    return {p.name for p in folder.iterdir() if p.name.endswith("-cache")}


@pytest.mark.slow
def test_the_compilation_cache_is_made_in_ckpt_guard_home_and_a_second_run_is_all_hits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tf4 = legacy_python()  # found in the checkout's .envs before the home changes
    home = tmp_path / "home"
    monkeypatch.setenv("CKPT_GUARD_HOME", str(home))
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    assert jax_cache.cache_dir() == home / "jax-cache"
    src = tiny_llama(tmp_path / "src")
    first = convert_parity(src, tmp_path / "flax", tmp_path / "r1.json", "--flax-python", str(tf4))
    compiled = programs(home / "jax-cache")
    assert first["passed"] is True and first["streamed"] is True and first["flax_class"] == "FlaxLlamaForCausalLM"
    assert len(compiled) > 20, compiled  # an eager Flax pass compiles each operation: every one is kept
    second = convert_parity(src, tmp_path / "flax", tmp_path / "r2.json", "--flax-python", str(tf4))
    assert programs(home / "jax-cache") == compiled  # nothing compiled anew: every program came from the cache
    assert first["comparisons"][0]["name"] == "fp32" and "flax vs fp32 reference" in [c["name"] for c in
                                                                                      first["comparisons"]]
    assert second["comparisons"] == first["comparisons"]  # the same figures, to the last bit
    assert second["passed"] is True


@pytest.mark.slow
def test_without_ckpt_guard_home_the_cache_is_in_the_xdg_cache_folder(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    tf4 = legacy_python()
    monkeypatch.delenv("CKPT_GUARD_HOME", raising=False)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    src = tiny_llama(tmp_path / "src")
    parity = convert_parity(src, tmp_path / "flax", tmp_path / "r.json", "--flax-python", str(tf4))
    assert parity["passed"] is True
    assert programs(tmp_path / "xdg" / "ckpt-guard" / "jax-cache")
    assert not (tmp_path / "user").exists()


@pytest.mark.slow
def test_a_cache_folder_the_user_set_for_jax_is_used_instead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tf4 = legacy_python()
    monkeypatch.setenv("CKPT_GUARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "theirs"))
    src = tiny_llama(tmp_path / "src")
    assert convert_parity(src, tmp_path / "flax", tmp_path / "r.json", "--flax-python", str(tf4))["passed"] is True
    assert programs(tmp_path / "theirs") and not (tmp_path / "home" / "jax-cache").exists()


# run as `python -m guard.worker ...`, then every module the worker holds at its exit, one a line, into sys.argv[1]
# (-X importtime misses what importlib.import_module imports, as transformers' lazy modules and warm() do)
MODULES_AT_EXIT = ("import atexit, runpy, sys\n"
                   "log, sys.argv = sys.argv[1], ['guard.worker', *sys.argv[2:]]\n"
                   "atexit.register(lambda: open(log, 'w').write('\\n'.join(sorted(sys.modules))))\n"
                   "runpy.run_module('guard.worker', run_name='__main__', alter_sys=True)\n")


def _logging_python(tmp_path: Path, tf4: Path) -> tuple[Path, Path]:
    """A wrapper of the transformers-4 Python that logs the worker's modules (``MODULES_AT_EXIT``), not the
    probe's."""
    log = tmp_path / "modules.log"
    script = tmp_path / "modules_at_exit.py"
    script.write_text(MODULES_AT_EXIT)
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nif [ "$2" = guard.worker ]; then shift 2; exec "{tf4}" "{script}" "{log}" "$@"\n'
                       f'fi\nexec "{tf4}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, log


@pytest.mark.slow
def test_the_flax_side_imports_neither_torch_nor_tensorflow(tmp_path: Path) -> None:
    import importlib.util

    assert importlib.util.find_spec("torch") and importlib.util.find_spec("tensorflow")  # installed, so avoidable
    wrapper, log = _logging_python(tmp_path, legacy_python())
    src = tiny_llama(tmp_path / "src")
    parity = convert_parity(src, tmp_path / "flax", tmp_path / "r.json", "--flax-python", str(wrapper))
    assert parity["passed"] is True and parity["streamed"] is True and parity["blocks"] == 2
    assert "not_located" not in parity  # the Flax side streamed by the PyTorch side's own block names
    imported = set(log.read_text().split())
    assert {"jax", "flax", "transformers", "transformers.modeling_flax_utils", "guard.worker.flax_side"} <= imported
    assert not {m for m in imported if m.split(".")[0] in ("torch", "tensorflow", "sklearn", "hqq", "torchao")}


@pytest.mark.slow
def test_a_worker_never_asked_is_ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker starts first; configs that disagree on the model type end the run before it is asked."""
    from guard.envs import worker
    from guard.parity.legacy_flax import run_parity_in_worker

    started: list[Any] = []
    original = worker.Started.__init__

    def record(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        started.append(self)

    monkeypatch.setattr(worker.Started, "__init__", record)
    src = tiny_llama(tmp_path / "src")
    other = tmp_path / "other"
    shutil.copytree(src, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "mistral"}))
    findings, figures = run_parity_in_worker(src, other, legacy_python())
    assert [f.code for f in findings] == ["CG302"] and figures["passed"] is False
    assert len(started) == 1
    process = started[0]._proc
    assert process is not None and process.poll() is not None  # ended, and waited for
    assert not os.path.exists(started[0]._path_dir.name)


# run in a fresh interpreter (this one has imported transformers): convert --parity, then what it imported
IMPORTED = """
import importlib.util, json, sys
from guard.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "imported": sorted({m.split(".")[0] for m, v in sys.modules.items() if v is not None}),
                  "findable": [n for n in ("hqq", "torchao", "kernels") if importlib.util.find_spec(n) is not None]}))
"""


@pytest.mark.slow
def test_the_pytorch_side_imports_neither_hqq_nor_torchao_nor_kernels(tmp_path: Path) -> None:
    """transformers imports them because they are installed; parity runs none of them (hqq brings torch's
    compiler): hidden while transformers is first imported, findable again after."""
    import importlib.util
    import subprocess
    import sys

    from guard.parity.unneeded import UNNEEDED

    assert all(importlib.util.find_spec(n) for n in UNNEEDED)  # installed here, so the test means something
    src = tiny_llama(tmp_path / "src")
    report = tmp_path / "r.json"
    env = {**os.environ, "CKPT_GUARD_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-c", IMPORTED, "convert", str(src), "--to", "flax", "--out",
                           str(tmp_path / "flax"), "--parity", "--flax-python", str(legacy_python()), "-f", "json",
                           "-o", str(report)], capture_output=True, text=True, env=env, check=True)
    answer = json.loads(done.stdout.splitlines()[-1])
    parity = json.loads(report.read_text())["extra"]["parity"]
    assert answer["code"] == 0 and parity["passed"] is True and parity["streamed"] is True
    assert {"torch", "transformers"} <= set(answer["imported"])
    assert not set(UNNEEDED) & set(answer["imported"])
    assert answer["findable"] == list(UNNEEDED)  # the process can import them again after parity


def test_hidden_leaves_a_process_that_imported_transformers_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from guard.parity.unneeded import UNNEEDED, hidden

    assert "transformers" in sys.modules  # imported at the top of this file
    before = {n: sys.modules.get(n, "absent") for n in UNNEEDED}
    with hidden():
        assert {n: sys.modules.get(n, "absent") for n in UNNEEDED} == before
    monkeypatch.delitem(sys.modules, "transformers")
    with hidden():
        assert all(sys.modules[n] is None for n in UNNEEDED if before[n] == "absent")
    assert {n: sys.modules.get(n, "absent") for n in UNNEEDED} == before
