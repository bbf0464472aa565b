"""The parity smoke test: the same seeded inputs through transformers' paired PyTorch and Flax classes.

Runs, each streamed block by block (``guard.parity.stream_torch``, ``stream_flax``: memory one block
deep; a model that cannot be streamed exactly loads whole, ``guard.parity.runs``), one side at a time:
- fp32 on both sides (stored weights upcast bit-exactly): judged by the fp32 bound.
  For bf16/fp16 weights this is the sharpest check of the conversion itself.
- for bf16/fp16 weights, also each side in its stored dtype: Flax's error against the PyTorch
  fp32 reference is judged against PyTorch's own error in that dtype (``guard.parity.verdict``).
Tolerances and their sources: ``guard.parity.metrics``, ``guard.parity.relative``, docs/parity.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from guard.catalogue import make_finding
from guard.errors import MissingExtraError
from guard.findings import Finding, Severity
from guard.inventory import display_path
from guard.parity.inputs import make_inputs
from guard.parity.model_dir import layer_count, read_config, stored_dtype
from guard.parity.needs import PARITY_MODULES, require_flax_transformers
from guard.parity.runs import Failed as _Failed, Unavailable as _Unavailable, quiet_transformers
from guard.parity.verdict import compare_runs, comparison_findings, low_dtype

# transformers' auto mappings that name Flax classes; the PyTorch twin has the same name minus "Flax".
FLAX_MAPPINGS = (
    "FLAX_MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "FLAX_MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "FLAX_MODEL_FOR_MASKED_LM_MAPPING_NAMES", "FLAX_MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "FLAX_MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "FLAX_MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES",
    "FLAX_MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "FLAX_MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "FLAX_MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", "FLAX_MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES",
    "FLAX_MODEL_FOR_NEXT_SENTENCE_PREDICTION_MAPPING_NAMES", "FLAX_MODEL_FOR_PRETRAINING_MAPPING_NAMES",
    "FLAX_MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", "FLAX_MODEL_MAPPING_NAMES",
)


def run_parity(torch_dir: Path, flax_dir: Path, *, seed: int = 0, drift: bool | None = None,
               flax_python: Path | None = None) -> tuple[list[Finding], dict[str, Any]]:
    """``drift``: also run the JAX fp32 pass at JAX's default matmul precision and report how far it
    lands (``guard.parity.accelerator``); None does so on an accelerator only.  ``flax_python``: the
    Flax side runs in that transformers-4 environment (``guard.parity.legacy_flax``; found by
    ``guard.parity.needs.flax_side_python``), else both sides run here."""
    if flax_python is not None:
        from guard.parity.legacy_flax import run_parity_in_worker

        return run_parity_in_worker(torch_dir, flax_dir, flax_python, seed=seed, drift=drift)
    _require_extras()
    from guard.parity import jax_cache

    jax_cache.enable()  # before this process compiles: JAX decides at its first compile whether the cache is on
    torch_dir, flax_dir = Path(torch_dir), Path(flax_dir)
    where = display_path(flax_dir)
    figures: dict[str, Any] = {"torch_dir": display_path(torch_dir), "flax_dir": where, "seed": seed,
                               "available": False, "passed": None, "comparisons": []}
    try:
        config = read_config(torch_dir)
        flax_raw = read_config(flax_dir)
        flax_type = flax_raw.get("model_type")
        if flax_type != config.get("model_type"):
            raise _Failed(make_finding("CG302", where, f"model_type differs: {config.get('model_type')!r} "
                                                        f"(PyTorch) vs {flax_type!r} (Flax)"))
        pt_name, flax_name = find_pair(config)
        stored = {"torch": stored_dtype(torch_dir), "flax": stored_dtype(flax_dir)}
        figures.update(model_type=config["model_type"], torch_class=pt_name, flax_class=flax_name,
                       stored_dtype=stored, available=True)
        with _numerics(), quiet_transformers():
            import transformers

            pt_cls, flax_cls = getattr(transformers, pt_name), getattr(transformers, flax_name)
            hf_config = transformers.AutoConfig.from_pretrained(torch_dir, local_files_only=True)
            disagreements = _config_disagreements(config, flax_raw, hf_config, flax_dir, stored, where)
            if disagreements:  # the outputs would compare two models other than the source's
                figures.update(passed=False, config_disagrees=[f.message for f in disagreements])
                return disagreements, figures
            inputs = make_inputs(hf_config, flax_cls, seed=seed)
            figures["inputs"] = {k: list(v.shape) for k, v in inputs.items()}
            runs, modules, blocks = _run_streamed(pt_cls, flax_cls, hf_config, torch_dir, flax_dir, inputs, stored,
                                                  figures)
            if runs is None:
                runs = _run_all(pt_cls, flax_cls, torch_dir, flax_dir, inputs, stored)
            _accelerator_figures(figures, drift, runs,
                                 lambda: _flax_fp32(flax_cls, hf_config, flax_dir, inputs, blocks))
    except _Unavailable as exc:
        figures.update(available=False, reason=str(exc))
        return [make_finding("CG303", where, f"parity unavailable: {exc}")], figures
    except _Failed as exc:
        figures["passed"] = False
        return [exc.finding], figures
    figures["comparisons"] = compare_runs(runs, stored, layers=layer_count(config), modules=modules, blocks=blocks)
    findings = comparison_findings(figures["comparisons"], where=where)
    figures["passed"] = not any(f.severity is Severity.error for f in findings)
    return findings, figures


def _accelerator_figures(figures: dict[str, Any], drift: bool | None, runs: dict[str, dict[str, Any]],
                         run_fp32: Any) -> None:
    from guard.parity.accelerator import backend_figures, default_precision_drift, wants_drift

    figures.update(backend_figures())
    if wants_drift(drift):
        figures["default_precision_drift"] = default_precision_drift(run_fp32, runs["flax:fp32"], runs["torch:fp32"])


def _flax_fp32(flax_cls: Any, hf_config: Any, flax_dir: Path, inputs: dict[str, Any], blocks: list[str] | None,
               ) -> dict[str, Any]:
    """The JAX fp32 pass once more, streamed as before where it was."""
    from guard.parity.runs import run_flax
    from guard.parity.stream_flax import stream_flax

    if blocks:
        return stream_flax(flax_cls, hf_config, flax_dir, "F32", inputs, blocks, [])[0]
    return run_flax(flax_cls, flax_dir, "F32", inputs)


def _config_disagreements(torch_raw: dict[str, Any], flax_raw: dict[str, Any], hf_config: Any, flax_dir: Path,
                          stored: dict[str, str], where: str) -> list[Finding]:
    """CG302s for config values a side reads otherwise than the source means (guard.parity.config_check)."""
    import transformers

    from guard.parity.config_check import config_disagreements, meant_values, read_values

    flax_config = transformers.AutoConfig.from_pretrained(flax_dir, local_files_only=True)
    sides = {"PyTorch": read_values(torch_raw, hf_config, flax=False),
             "Flax": read_values(flax_raw, flax_config, flax=True)}
    return config_disagreements(meant_values(torch_raw, hf_config), sides, where=where,
                                same_weights_dtype=stored["torch"] == stored["flax"])


def _run_streamed(pt_cls: Any, flax_cls: Any, hf_config: Any, torch_dir: Path, flax_dir: Path,
                  inputs: dict[str, Any], stored: dict[str, str], figures: dict[str, Any],
                  ) -> tuple[dict[str, dict[str, Any]] | None, dict[str, dict[str, Any]] | None, list[str] | None]:
    """Every pass block by block (``guard.parity.stream_torch``): memory one block deep, whatever the
    depth.  A model that cannot be streamed exactly runs whole instead (``figures["streamed"]`` says why)."""
    from guard.parity.stream_flax import stream_flax
    from guard.parity.stream_torch import stream_torch
    from guard.parity.weights import NotStreamable

    runs: dict[str, dict[str, Any]] = {}
    modules: dict[str, dict[str, Any]] = {}
    passes = [("torch:fp32", "F32"), ("flax:fp32", "F32")]
    low = low_dtype(stored)
    if low is not None:
        passes += [("torch:stored", low), ("flax:stored", low)]
    blocks: list[str] = []
    leaves: list[str] = []
    # leaf units stream too unless a side reads them outside their own call (Flax's tied heads read the
    # embedding's variables); such a pass is retried with them resident
    tied = getattr(hf_config, "tie_word_embeddings", False)
    whole_leaves: dict[str, list[str]] = {"torch": [], "flax": []} if not tied else {"torch": []}
    try:
        for label, dtype in passes:
            _give_back_freed_memory()
            side = label.split(":")[0]
            for stream_leaves in (True, False) if side in whole_leaves else (False,):
                try:
                    if side == "torch":
                        runs[label], modules[label], blocks, leaves = stream_torch(
                            pt_cls, hf_config, torch_dir, dtype, inputs, leaves=stream_leaves)
                    else:
                        runs[label], modules[label] = stream_flax(flax_cls, hf_config, flax_dir, dtype, inputs,
                                                                  blocks, leaves if stream_leaves else [])
                    break
                except NotStreamable as exc:
                    if not stream_leaves:
                        raise
                    whole_leaves.pop(side, None)
                    figures["leaves_resident"] = str(exc)
    except NotStreamable as exc:
        figures.update(streamed=False, not_streamed=str(exc))
        return None, None, None
    figures.update(streamed=True, blocks=len(blocks), leaves_streamed=sorted(whole_leaves))
    return runs, modules, blocks


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def _give_back_freed_memory() -> None:
    """glibc keeps freed heap pages (a conversion's, the last pass's) in its arenas; hand them back
    before a pass, so each pass's peak starts from what is live.  And fix the mmap threshold at
    1 MiB: glibc raises it to the size of each freed mapping (up to 32 MiB), after which a block's
    tensors come from the heap, and interleaved small allocations can keep a heap that grows
    block by block.  Mapped tensors go back to the system when dropped.  Elsewhere nothing to do."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)  # the process's own symbols: glibc's where there is one
        libc.mallopt(M_MMAP_THRESHOLD, 1 << 20)
        libc.malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass


def _run_all(pt_cls: Any, flax_cls: Any, torch_dir: Path, flax_dir: Path, inputs: dict[str, Any],
             stored: dict[str, str]) -> dict[str, dict[str, Any]]:
    from guard.parity.runs import run_flax, run_torch

    runs = {"torch:fp32": run_torch(pt_cls, torch_dir, "F32", inputs),
            "flax:fp32": run_flax(flax_cls, flax_dir, "F32", inputs)}
    low = low_dtype(stored)
    if low is not None:  # both in the narrower dtype: PyTorch's own error is the yardstick for Flax's
        runs["torch:stored"] = run_torch(pt_cls, torch_dir, low, inputs)
        runs["flax:stored"] = run_flax(flax_cls, flax_dir, low, inputs)
    return runs


def find_pair(config: dict[str, Any], *, base_pt: str | None = None) -> tuple[str, str]:
    """(PyTorch class, Flax class) for a config: its ``architectures`` where Flax has the twin,
    else the base models (``base_pt``: the PyTorch base class as the parent's transformers names it, so a
    Flax side without torch needs no PyTorch auto mapping).  Raises _Unavailable when transformers pairs none."""
    from transformers.models.auto import (  # type: ignore[attr-defined]  # modeling_flax_auto: transformers 4 only
        configuration_auto,
        modeling_flax_auto,
    )

    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise _Unavailable("config.json has no model_type")
    if model_type not in configuration_auto.CONFIG_MAPPING_NAMES:
        raise _Unavailable(f"transformers does not know model_type {model_type!r}")
    flax_names = {getattr(modeling_flax_auto, m).get(model_type) for m in FLAX_MAPPINGS} - {None}
    from guard.convert.map.families import FLAX_NAMES

    for arch in config.get("architectures") or ():
        twin = FLAX_NAMES.get(arch, f"Flax{arch}") if isinstance(arch, str) else None
        if twin is not None and twin in flax_names:
            return arch, twin
    base_flax = modeling_flax_auto.FLAX_MODEL_MAPPING_NAMES.get(model_type)
    if base_pt is None:
        from guard.parity.legacy_flax import base_torch_class

        base_pt = base_torch_class(model_type)
    if base_flax is None or base_pt is None:
        raise _Unavailable(f"transformers has no paired PyTorch/Flax classes for model_type {model_type!r}")
    return str(base_pt), base_flax


@contextlib.contextmanager
def _numerics() -> Iterator[None]:
    """fp32 matmuls at full precision (TPU defaults to bf16 passes, GPU to TF32: jax#18934)."""
    import jax
    import torch

    previous = jax.config.jax_default_matmul_precision  # type: ignore[attr-defined]  # an option jax's stub lacks
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    jax.config.update("jax_default_matmul_precision", "highest")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        jax.config.update("jax_default_matmul_precision", previous)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def _require_extras() -> None:
    require_flax_transformers("parity")
    for module in PARITY_MODULES:  # present, and importable (a broken install is the same one line)
        try:
            __import__(module)
        except ImportError:
            raise MissingExtraError(module, "parity") from None
