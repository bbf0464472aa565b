"""Parity with the Flax side in a transformers-4 environment, the PyTorch side in this process.

transformers 5 removed its Flax models, and a config transformers 5 wrote is read right only by 5.x
(4.57 takes the default rope_theta from ``rope_parameters``).  So the PyTorch side runs here, with the
installed transformers, and the Flax side in the environment ``guard.parity.needs.flax_side_python``
found, through the worker protocol (``guard.envs.worker``, answered by ``guard.worker.flax_side``): one
subprocess, one request, started first (``--warm``) so that its imports (jax, flax, transformers 4's Flax
classes; never torch or TensorFlow: ``USE_TORCH=0``, ``USE_TF=0``) run while this process imports its own
side.  The worker says which transformers it imported: 5 is exit 2 (one line), never a CG303 note and a pass.
This side imports transformers without the packages it imports only because they are installed and parity
never runs (``guard.parity.unneeded``: hqq and with it torch's compiler, torchao, kernels).

Order: the config first (what the source means, read here; what the Flax side reads, read there: a
difference is CG302 and no output is compared), then the worker's seeded inputs through this side's
PyTorch class, fp32 and the stored dtype, judged as ``guard.parity.run`` judges them.  Each side streams
block by block where it can, as in one process (``guard.parity.stream_torch`` here, ``stream_flax`` in the
worker, by the blocks of this side's PyTorch twin, sent with the request): memory one block deep on both
sides.  The worker sends each block's output back, so a miss is located to the block where it starts.  A
side that cannot stream runs whole, and then nothing is located.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any

from guard.catalogue import make_finding
from guard.findings import Finding, Severity
from guard.inventory import display_path
from guard.parity.runs import Failed, Unavailable


def run_parity_in_worker(torch_dir: Path, flax_dir: Path, python: Path, *, seed: int = 0,
                         drift: bool | None = None) -> tuple[list[Finding], dict[str, Any]]:
    torch_dir, flax_dir = Path(torch_dir), Path(flax_dir)
    where = display_path(flax_dir)
    figures: dict[str, Any] = {"torch_dir": display_path(torch_dir), "flax_dir": where, "seed": seed,
                               "available": False, "passed": None, "comparisons": [],
                               "flax_side": {"python": str(python)}}
    from guard.parity.unneeded import hidden

    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ckpt-guard-flax-side-")))
        worker = stack.enter_context(start_flax_side(python, tmp))
        stack.enter_context(hidden())  # transformers' hqq, torchao and kernels: this side never runs them
        return _run(torch_dir, flax_dir, python, seed, drift, figures, where, worker, tmp)


def start_flax_side(python: Path, out_dir: Path) -> Any:
    """The Flax side's worker, started now (``guard.envs.worker.Started``): its imports overlap this process's."""
    from guard.envs.worker import Started

    return Started(python, out_dir, env=dict(FLAX_SIDE_ENV), warm="flax")


# transformers 4 imports torch and TensorFlow where installed, and what they bring (torch's compiler, TF's
# distribution strategies): the Flax side uses neither (the parent sends the PyTorch twin's blocks)
FLAX_SIDE_ENV = {"USE_TORCH": "0", "USE_TF": "0"}


def _run(torch_dir: Path, flax_dir: Path, python: Path, seed: int, drift: bool | None, figures: dict[str, Any],
         where: str, worker: Any, tmp: Path) -> tuple[list[Finding], dict[str, Any]]:
    from guard.parity.model_dir import layer_count, read_config, stored_dtype
    from guard.parity.runs import quiet_transformers
    from guard.parity.verdict import compare_runs, comparison_findings

    try:
        config, flax_raw = read_config(torch_dir), read_config(flax_dir)
        if flax_raw.get("model_type") != config.get("model_type"):
            raise Failed(make_finding("CG302", where, f"model_type differs: {config.get('model_type')!r} "
                                                      f"(PyTorch) vs {flax_raw.get('model_type')!r} (Flax)"))
        stored = {"torch": stored_dtype(torch_dir), "flax": stored_dtype(flax_dir)}
        figures.update(model_type=config["model_type"], stored_dtype=stored)
        with quiet_transformers():
            findings, runs, streaming = _both_sides(torch_dir, flax_dir, python, config, stored, seed, drift, figures,
                                                    where, worker, tmp)
    except Unavailable as exc:
        figures.update(available=False, reason=str(exc))
        return [make_finding("CG303", where, f"parity unavailable: {exc}")], figures
    except Failed as exc:
        figures["passed"] = False
        return [exc.finding], figures
    if findings:  # the config check: the outputs would compare another model than the source's
        figures.update(passed=False, config_disagrees=[f.message for f in findings])
        return findings, figures
    default = runs.pop("flax:fp32:default", None)
    if default is not None:
        from guard.parity.accelerator import drift_figures

        figures["default_precision_drift"] = drift_figures(default, runs["flax:fp32"], runs["torch:fp32"])
    modules, blocks = streaming.get("modules"), streaming.get("blocks")
    figures["comparisons"] = compare_runs(runs, stored, layers=layer_count(config), modules=modules, blocks=blocks)
    findings = comparison_findings(figures["comparisons"], where=where)
    figures["passed"] = not any(f.severity is Severity.error for f in findings)
    return findings, figures


def _both_sides(torch_dir: Path, flax_dir: Path, python: Path, config: dict[str, Any], stored: dict[str, str],
                seed: int, drift: bool | None, figures: dict[str, Any], where: str, worker: Any, tmp: Path,
                ) -> tuple[list[Finding], dict[str, dict[str, Any]], dict[str, Any]]:
    """(config findings, runs, {"modules", "blocks"} where both sides streamed alike, else {})."""
    import transformers

    from guard.envs.find import version_warning
    from guard.envs.protocol import ProtocolError, read_array
    from guard.envs.registry import ENVIRONMENTS
    from guard.parity.config_check import config_disagreements, meant_values, read_values
    from guard.parity.needs import check_worker_transformers
    from guard.parity.verdict import low_dtype

    hf_config = transformers.AutoConfig.from_pretrained(torch_dir, local_files_only=True)
    meant = meant_values(config, hf_config)
    low = low_dtype(stored)
    passes = [("flax:fp32", "F32"), *([("flax:stored", low)] if low else [])]
    units, base = _torch_units(config, hf_config)
    answer = worker.ask({"target": "flax", "flax_dir": str(flax_dir.resolve()), "torch_config": config,
                         "meant": meant, "same_weights_dtype": stored["torch"] == stored["flax"], "seed": seed,
                         "passes": passes, "drift": drift, "torch_base": base, "torch_units": units})
    side = answer["parity"]
    version = answer.get("library", {}).get("version")
    check_worker_transformers(version, python)  # what it imported, not what a probe saw: 5 is exit 2
    figures["flax_side"].update(transformers=version)
    warning = version_warning(ENVIRONMENTS["tf4"], str(version), f"in {python}")
    if warning:
        figures["flax_side"]["warning"] = warning
    figures.update(answer.get("backend", {}))
    if "unavailable" in side:
        raise Unavailable(str(side["unavailable"]))
    if "failed" in side:
        raise Failed(make_finding(str(side["failed"]["code"]), where, str(side["failed"]["message"])))
    figures.update(torch_class=side["torch_class"], flax_class=side["flax_class"], available=True)
    sides = {"PyTorch": read_values(config, hf_config, flax=False), "Flax": side["config_read"]}
    disagreements = config_disagreements(meant, sides, where=where,
                                         same_weights_dtype=stored["torch"] == stored["flax"])
    if disagreements:
        return disagreements, {}, {}
    try:
        inputs = {name: read_array(record, tmp) for name, record in side["inputs"].items()}
        runs = {label: {name: read_array(record, tmp) for name, record in outputs.items()}
                for label, outputs in side["runs"].items()}
        flax_modules = {label: {str(name): read_array(record, tmp) for name, record in pairs}
                        for label, pairs in side.get("modules", {}).items()}
        flax_streaming = dict(side.get("streaming") or {"streamed": False, "not_streamed": "not said"})
    except (ProtocolError, KeyError, TypeError, ValueError) as exc:
        from guard.envs.worker import WorkerFailed

        raise WorkerFailed(f"{python} -m guard.worker: {exc}") from None
    for array_file in tmp.glob("*.npy"):  # read: the disk (often memory, a tmpfs) back before the PyTorch passes
        array_file.unlink()
    figures["inputs"] = {k: list(v.shape) for k, v in inputs.items()}
    torch_runs, torch_modules, torch_streaming = _torch_runs(side["torch_class"], hf_config, torch_dir, inputs, low)
    runs.update(torch_runs)
    return [], runs, _streaming(figures, torch_streaming, flax_streaming, torch_modules, flax_modules)


MAX_CANDIDATES = 8  # a hostile config's architectures list is not built class by class


def _torch_units(config: dict[str, Any], hf_config: Any) -> tuple[dict[str, dict[str, list[str]]], str | None]:
    """The units (blocks, large leaves) each PyTorch class the Flax side may pair streams by: the config's
    architectures and the base model, built on the meta device (no memory) with this transformers; and the
    base model's name.  The Flax side streams by them, so it needs no torch of its own."""
    import torch
    import transformers

    from guard.parity.stream_torch import find_blocks, leaf_units, skeleton
    from guard.parity.weights import NotStreamable

    model_type = config.get("model_type")
    base = base_torch_class(model_type) if isinstance(model_type, str) else None
    names = [a for a in config.get("architectures") or () if isinstance(a, str)][:MAX_CANDIDATES]
    units: dict[str, dict[str, list[str]]] = {}
    for name in dict.fromkeys([*names, *([base] if base else [])]):
        cls = getattr(transformers, name, None)
        if not isinstance(cls, type):
            continue
        try:
            model = skeleton(cls, hf_config, torch.float32)
        except NotStreamable:
            continue
        blocks = find_blocks(model)
        units[name] = {"blocks": blocks, "leaves": leaf_units(model, blocks) if blocks else []}
    return units, base


def base_torch_class(model_type: str) -> str | None:
    """The PyTorch base model class transformers maps ``model_type`` to (imports its PyTorch auto mapping)."""
    from transformers.models.auto import modeling_auto

    base = modeling_auto.MODEL_MAPPING_NAMES.get(model_type)
    if isinstance(base, tuple | list):
        base = base[0]
    return None if base is None else str(base)


def _streaming(figures: dict[str, Any], torch_side: dict[str, Any], flax_side: dict[str, Any],
               torch_modules: dict[str, Any], flax_modules: dict[str, Any]) -> dict[str, Any]:
    """How each side ran, into the figures; the module outputs to locate a miss by, where both streamed over the
    same blocks (transformers 4's and 5's PyTorch classes of an architecture name their layers alike)."""
    blocks = torch_side.get("blocks")
    if not torch_side["streamed"] or not flax_side.get("streamed"):
        reasons = [f"{who}: {how.get('not_streamed')}" for who, how in (("PyTorch", torch_side), ("Flax", flax_side))
                   if not how.get("streamed")]
        figures.update(streamed=False, not_streamed="; ".join(reasons))
        return {}
    assert blocks is not None  # the PyTorch side streamed, so it names its blocks
    figures.update(streamed=True, blocks=len(blocks),
                   leaves_streamed=[s for s, how in (("flax", flax_side), ("torch", torch_side))
                                    if how.get("leaves_streamed")])
    for who, how in (("flax", flax_side), ("torch", torch_side)):
        if how.get("leaves_resident"):
            figures["leaves_resident"] = f"{who}: {how['leaves_resident']}"
    if list(flax_side.get("blocks") or []) != list(blocks):
        figures["not_located"] = "the two sides' PyTorch classes name their blocks differently"
        return {}
    return {"modules": {**torch_modules, **flax_modules}, "blocks": blocks}


def _torch_runs(pt_name: str, hf_config: Any, torch_dir: Path, inputs: dict[str, Any], low: str | None,
                ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], dict[str, Any]]:
    """This transformers' PyTorch twin of the worker's Flax class, fp32 and the stored dtype, TF32 off: streamed
    block by block (``guard.parity.stream_torch``), else whole.  (runs, module outputs, how it ran)"""
    import torch
    import transformers

    pt_cls = getattr(transformers, pt_name, None)
    if pt_cls is None:
        raise Unavailable(f"transformers {transformers.__version__} has no {pt_name} (the Flax side's twin)")
    passes = [("torch:fp32", "F32"), *([("torch:stored", low)] if low is not None else [])]
    # PyTorch's own error in the stored dtype is the yardstick for Flax's
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        return _torch_passes(pt_cls, hf_config, torch_dir, inputs, passes)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def _torch_passes(pt_cls: Any, hf_config: Any, torch_dir: Path, inputs: dict[str, Any], passes: list[tuple[str, str]],
                  ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], dict[str, Any]]:
    from guard.parity.runs import run_torch
    from guard.parity.stream_torch import stream_torch
    from guard.parity.weights import NotStreamable

    runs: dict[str, dict[str, Any]] = {}
    modules: dict[str, dict[str, Any]] = {}
    how: dict[str, Any] = {"streamed": True, "leaves_streamed": True}
    try:
        for label, dtype in passes:
            try:
                runs[label], modules[label], how["blocks"], _ = stream_torch(
                    pt_cls, hf_config, torch_dir, dtype, inputs, leaves=how["leaves_streamed"])
            except NotStreamable as exc:
                if not how["leaves_streamed"]:
                    raise
                how.update(leaves_streamed=False, leaves_resident=str(exc))
                runs[label], modules[label], how["blocks"], _ = stream_torch(
                    pt_cls, hf_config, torch_dir, dtype, inputs, leaves=False)
        return runs, modules, how
    except NotStreamable as exc:
        whole = {label: run_torch(pt_cls, torch_dir, dtype, inputs) for label, dtype in passes}
        return whole, {}, {"streamed": False, "not_streamed": str(exc)}
