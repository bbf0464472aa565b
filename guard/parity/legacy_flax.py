"""Parity with the Flax side in a transformers-4 environment, the PyTorch side in this process.

transformers 5 removed its Flax models, and a config transformers 5 wrote is read right only by 5.x
(4.57 takes the default rope_theta from ``rope_parameters``).  So the PyTorch side runs here, with the
installed transformers, and the Flax side in the environment ``guard.parity.needs.flax_side_python``
found, through the worker protocol (``guard.worker.flax_side``): one subprocess, one request.

Order: the config first (what the source means, read here; what the Flax side reads, read there: a
difference is CG302 and no output is compared), then the worker's seeded inputs through this side's
PyTorch class, fp32 and the stored dtype, judged as ``guard.parity.run`` judges them.  Each side loads
its model whole here: the worker's outputs come back as arrays, not block by block.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from guard.catalogue import make_finding
from guard.findings import Finding, Severity
from guard.inventory import display_path
from guard.parity.runs import Failed, Unavailable


def run_parity_in_worker(torch_dir: Path, flax_dir: Path, python: Path, *, seed: int = 0,
                         drift: bool | None = None) -> tuple[list[Finding], dict[str, Any]]:
    from guard.parity.model_dir import layer_count, read_config, stored_dtype
    from guard.parity.runs import quiet_transformers
    from guard.parity.verdict import compare_runs, comparison_findings

    torch_dir, flax_dir = Path(torch_dir), Path(flax_dir)
    where = display_path(flax_dir)
    figures: dict[str, Any] = {"torch_dir": display_path(torch_dir), "flax_dir": where, "seed": seed,
                               "available": False, "passed": None, "comparisons": [],
                               "flax_side": {"python": str(python)}}
    try:
        config, flax_raw = read_config(torch_dir), read_config(flax_dir)
        if flax_raw.get("model_type") != config.get("model_type"):
            raise Failed(make_finding("CG302", where, f"model_type differs: {config.get('model_type')!r} "
                                                      f"(PyTorch) vs {flax_raw.get('model_type')!r} (Flax)"))
        stored = {"torch": stored_dtype(torch_dir), "flax": stored_dtype(flax_dir)}
        figures.update(model_type=config["model_type"], stored_dtype=stored)
        with quiet_transformers():
            findings, runs = _both_sides(torch_dir, flax_dir, python, config, stored, seed, drift, figures, where)
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
    figures["comparisons"] = compare_runs(runs, stored, layers=layer_count(config))
    findings = comparison_findings(figures["comparisons"], where=where)
    figures["passed"] = not any(f.severity is Severity.error for f in findings)
    return findings, figures


def _both_sides(torch_dir: Path, flax_dir: Path, python: Path, config: dict[str, Any], stored: dict[str, str],
                seed: int, drift: bool | None, figures: dict[str, Any], where: str,
                ) -> tuple[list[Finding], dict[str, dict[str, Any]]]:
    import transformers

    from guard.parity.config_check import config_disagreements, meant_values, read_values
    from guard.parity.verdict import low_dtype
    from guard.worker.client import run_worker
    from guard.worker.protocol import ProtocolError, read_array

    hf_config = transformers.AutoConfig.from_pretrained(torch_dir, local_files_only=True)
    meant = meant_values(config, hf_config)
    low = low_dtype(stored)
    passes = [("flax:fp32", "F32"), *([("flax:stored", low)] if low else [])]
    figures["streamed"] = False
    figures["not_streamed"] = "the Flax side runs in another environment: each side loads its model whole"
    with tempfile.TemporaryDirectory(prefix="ckpt-guard-flax-side-") as tmp:
        answer = run_worker(python, {"target": "flax", "flax_dir": str(flax_dir.resolve()), "torch_config": config,
                                     "meant": meant, "same_weights_dtype": stored["torch"] == stored["flax"],
                                     "seed": seed, "passes": passes, "drift": drift}, Path(tmp))
        side = answer["parity"]
        figures["flax_side"].update(transformers=answer.get("library", {}).get("version"))
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
            return disagreements, {}
        try:
            inputs = {name: read_array(record, Path(tmp)) for name, record in side["inputs"].items()}
            runs = {label: {name: read_array(record, Path(tmp)) for name, record in outputs.items()}
                    for label, outputs in side["runs"].items()}
        except (ProtocolError, KeyError, TypeError) as exc:
            from guard.worker.client import WorkerFailed

            raise WorkerFailed(f"{python} -m guard.worker: {exc}") from None
    figures["inputs"] = {k: list(v.shape) for k, v in inputs.items()}
    runs.update(_torch_runs(side["torch_class"], torch_dir, inputs, low))
    return [], runs


def _torch_runs(pt_name: str, torch_dir: Path, inputs: dict[str, Any], low: str | None) -> dict[str, dict[str, Any]]:
    """This transformers' PyTorch twin of the worker's Flax class, fp32 and the stored dtype, TF32 off."""
    import torch
    import transformers

    from guard.parity.runs import run_torch

    pt_cls = getattr(transformers, pt_name, None)
    if pt_cls is None:
        raise Unavailable(f"transformers {transformers.__version__} has no {pt_name} (the Flax side's twin)")
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        runs = {"torch:fp32": run_torch(pt_cls, torch_dir, "F32", inputs)}
        if low is not None:  # PyTorch's own error in the stored dtype is the yardstick for Flax's
            runs["torch:stored"] = run_torch(pt_cls, torch_dir, low, inputs)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    return runs
