"""Parity's Flax side, in the worker (a transformers-4 environment: 4.x is the last line with Flax models).

The parent (``guard.parity.legacy_flax``) runs the PyTorch side with its own transformers (5.x reads the
config 5.x wrote) and sends what the source's config means.  Here: the Flax class transformers 4 pairs
with the source's architecture (``guard.parity.run.find_pair``), the Flax config as this transformers
reads it (``guard.parity.config_check.read_values``), and, only when that reading agrees with the
meaning, the seeded inputs (``guard.parity.inputs``) through the whole model
(``guard.parity.runs.run_flax``): fp32 under matmul precision "highest", then the stored dtype, then,
where asked or on an accelerator, fp32 once more at JAX's default precision (a figure, never a verdict).

Request: ``{"target": "flax", "flax_dir", "torch_config", "meant", "same_weights_dtype", "seed",
"passes": [["flax:fp32", "F32"], ["flax:stored", "BF16"]], "drift": bool | null, "torch_base": NAME,
"torch_units": {PyTorch class: {"blocks": [...], "leaves": [...]}}}``: the parent's PyTorch classes that may
pair (the config's architectures and the base model, ``torch_base``) and the units each streams by, so this side
needs no torch: the parent starts it with transformers' ``USE_TORCH=0`` and ``USE_TF=0`` (neither is imported,
nor what transformers imports beside them), and ``warm`` imports jax, flax and transformers' Flax classes
while the parent converts and imports its own side.  JAX's persistent compilation cache is on
(``guard.parity.jax_cache``).  Answer: the protocol's
envelope with ``"parity": {"torch_class", "flax_class", "config_read", "inputs", "runs"}`` (arrays as
records), or ``{"unavailable": why}`` (CG303), or ``{"failed": {"code", "message"}}`` (the side's finding).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from guard.envs.protocol import write_array

LIBRARY = "transformers"


def version() -> str:
    from importlib.metadata import version as dist_version

    return dist_version("transformers")


def warm() -> None:
    """What every request needs, imported before the request comes (``python -m guard.worker --warm flax``)."""
    import importlib

    try:
        import jax  # noqa: F401

        for module in ("transformers.modeling_flax_utils", "transformers.models.auto.configuration_auto",
                       "transformers.models.auto.modeling_flax_auto"):  # transformers 4's Flax base, find_pair's maps
            importlib.import_module(module)
    except ImportError:
        return  # a head start only: the request meets the same import and says which transformers it found

    from guard.parity import jax_cache

    jax_cache.enable()


def answer(request: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """The envelope's body (``guard.worker.__main__`` wraps it as every side's): ``"parity"`` beside no loads."""
    from guard.parity.runs import Failed, Unavailable

    try:
        result = _run(request, out_dir)
    except Unavailable as exc:
        result = {"unavailable": str(exc)}
    except Failed as exc:
        result = {"failed": {"code": exc.finding.code, "message": exc.finding.message}}
    return {"loads": [], "parity": result}


def _run(request: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    from transformers.utils import logging as hf_logging

    from guard.parity import jax_cache
    from guard.parity.accelerator import wants_drift
    from guard.parity.config_check import config_disagreements, read_values
    from guard.parity.inputs import make_inputs
    from guard.parity.needs import has_flax_models
    from guard.parity.run import find_pair
    from guard.parity.runs import Unavailable

    if not has_flax_models(version()):
        raise Unavailable(f"the Flax side's environment has transformers {version()}, which has no Flax models")
    hf_logging.disable_progress_bar()
    jax_cache.enable()
    import transformers

    flax_dir = Path(request["flax_dir"])
    pt_name, flax_name = find_pair(request["torch_config"], base_pt=request.get("torch_base"))
    flax_cls = getattr(transformers, flax_name)
    try:  # the parent read config.json already (CG001 when malformed): what is left is transformers' reading
        flax_raw = json.loads((flax_dir / "config.json").read_text(encoding="utf-8"))
        flax_config = transformers.AutoConfig.from_pretrained(flax_dir, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise Unavailable(f"transformers {version()} cannot read {flax_dir.name}/config.json: "
                          f"{' '.join(str(exc).split())[:300]}") from None
    read = read_values(flax_raw, flax_config, flax=True)
    result: dict[str, Any] = {"torch_class": pt_name, "flax_class": flax_name, "config_read": read, "runs": {}}
    if config_disagreements(request["meant"], {"Flax": read}, where="-",
                            same_weights_dtype=request["same_weights_dtype"]):
        return result  # the outputs would be another model's: the parent words the findings
    inputs = make_inputs(flax_config, flax_cls, seed=int(request["seed"]))
    result["inputs"] = {name: write_array(value, out_dir, f"input{i}") for i, (name, value) in
                        enumerate(sorted(inputs.items()))}
    passes = [tuple(p) for p in request["passes"]]
    if wants_drift(request.get("drift")):
        passes.append(("flax:fp32:default", "F32"))
    units = (request.get("torch_units") or {}).get(pt_name)
    runs, modules, result["streaming"] = _passes(flax_cls, units, pt_name, flax_config, flax_dir, passes, inputs)
    for number, (label, outputs) in enumerate(runs.items()):
        result["runs"][label] = {name: write_array(value, out_dir, f"run{number}-{i}") for i, (name, value) in
                                 enumerate(sorted(outputs.items()))}
    # each block's output (and its direct children's), for the parent's located verdict; names are the
    # model class's modules, the files numbered
    result["modules"] = {label: [[name, write_array(value, out_dir, f"mod{number}-{i}")]
                                 for i, (name, value) in enumerate(recorded.items())]
                         for number, (label, recorded) in enumerate(modules.items())}
    return result


def _passes(flax_cls: Any, units: dict[str, Any] | None, pt_name: str, config: Any, flax_dir: Path,
            passes: list[tuple[str, str]], inputs: dict[str, Any],
            ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(outputs by pass, module outputs by pass, how it ran).  Streamed block by block as parity streams in one
    process (``guard.parity.stream_flax``), the blocks those of the parent's PyTorch twin (the names its PyTorch
    side streams by), so memory stays one block deep; else the whole model."""
    import jax

    from guard.parity.runs import run_flax
    from guard.parity.weights import NotStreamable

    runs: dict[str, Any] = {}
    modules: dict[str, Any] = {}
    try:
        blocks, leaves = _units(units, pt_name, config)
        resident = None
        for label, dtype in passes:
            # fp32 as PyTorch on a CPU computes it; the drift pass at what JAX users run by default
            with jax.default_matmul_precision("default" if label.endswith(":default") else "highest"):
                runs[label], recorded, why = _streamed(flax_cls, config, flax_dir, dtype, inputs, blocks,
                                                       leaves if resident is None else [])
            resident = resident or why  # once a pass kept its leaves resident, the later ones do too
            if not label.endswith(":default"):  # the drift pass is a figure: no located verdict
                modules[label] = recorded
        tied = getattr(config, "tie_word_embeddings", False)  # as in one process: a tied head's leaves stay
        how: dict[str, Any] = {"streamed": True, "blocks": blocks, "leaves_streamed": not tied and not resident}
        if resident:
            how["leaves_resident"] = resident
        return runs, modules, how
    except NotStreamable as exc:
        runs, reason = {}, str(exc)
    for label, dtype in passes:
        with jax.default_matmul_precision("default" if label.endswith(":default") else "highest"):
            runs[label] = run_flax(flax_cls, flax_dir, dtype, inputs)
    return runs, {}, {"streamed": False, "not_streamed": reason}


def _units(units: dict[str, Any] | None, pt_name: str, config: Any) -> tuple[list[str], list[str]]:
    """The blocks and large leaves (embeddings, head) of the PyTorch twin, as the parent built it on the meta
    device.  Flax's tied head reads the embedding's variables outside its own call: no leaves then."""
    from guard.parity.weights import NotStreamable

    if not units or not units.get("blocks"):
        raise NotStreamable(f"the PyTorch side has no blocks of {pt_name} to stream by")
    tied = getattr(config, "tie_word_embeddings", False)
    return [str(b) for b in units["blocks"]], [] if tied else [str(u) for u in units.get("leaves") or []]


def _streamed(flax_cls: Any, config: Any, flax_dir: Path, dtype: str, inputs: dict[str, Any], blocks: list[str],
              leaves: list[str]) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """One pass, streamed; with its leaves resident where streaming them fails (the reason returned)."""
    from guard.parity.stream_flax import stream_flax
    from guard.parity.weights import NotStreamable

    if leaves:
        try:
            return (*stream_flax(flax_cls, config, flax_dir, dtype, inputs, blocks, leaves), None)
        except NotStreamable as exc:
            return (*stream_flax(flax_cls, config, flax_dir, dtype, inputs, blocks, []), str(exc))
    return (*stream_flax(flax_cls, config, flax_dir, dtype, inputs, blocks, []), None)
