"""``parity SRC --against STACK``: the stack's own loader and forward against the file and PyTorch.

For each of the target's loads (its defaults, its recommended exact options, and any load the row
adds for the file's dtype) the worker (``guard.worker``) runs the library in its environment and
returns every parameter it holds and its logits for the seeded inputs, in fp32 (under matmul
precision "highest") and in the file's dtype.  Each load is judged twice:
- its tree against the file, bit for bit after the mapping (``guard.against.tree``);
- its forward against transformers' PyTorch forward of the same file, as ``parity`` judges a Flax
  side (``guard.parity.verdict``): fp32 by the fp32 bound, the stored dtype relative to PyTorch's
  own error in that dtype.
"""

from __future__ import annotations

import json
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

from guard.against.targets import TARGETS, Load, Target
from guard.catalogue import make_finding
from guard.errors import UsageError
from guard.findings import Finding, Severity
from guard.inventory import display_path
from guard.lazy import resolve

SEQ_LEN, BATCH = 16, 2


def environment_python(target: Target, python: Path | None) -> tuple[Path, tuple[Path, ...]]:
    """The Python the worker runs with, and folders to put on its path (``guard.envs.find``).  Missing: one
    line naming `ckpt-guard env install`, before anything runs."""
    found = find_environment(target, python)
    return found.python, found.path


def find_environment(target: Target, python: Path | None) -> Any:
    """``guard.envs.find.Found``: where the target's library runs; a version it was not checked with is warned
    about here and recorded in the report's figures."""
    from guard.envs.find import find

    found = find(target.environment, python, what=f"--against {target.name}")
    if found.warning:
        sys.stderr.write(f"ckpt-guard: warning: {found.warning}\n")
    return found


def run_against(src: Path, name: str, *, seed: int = 0, python: Path | None = None, converted: Path | None = None,
                drift: bool | None = None) -> tuple[list[Finding], dict[str, Any]]:
    """``converted``: for a target that converts first, the conversion already written (``convert --parity``).
    ``drift``: as ``parity --drift`` (None: where the worker's JAX sees an accelerator); a figure, not judged."""
    from guard.parity.model_dir import stored_dtype
    from guard.parity.verdict import low_dtype

    target = TARGETS[name]
    src = Path(src)
    where = display_path(src)
    config = _config(src)
    model_type = config.get("model_type")
    figures: dict[str, Any] = {"torch_dir": where, "flax_dir": f"{target.library} {target.version}", "seed": seed,
                               "against": target.name, "available": False, "passed": None, "comparisons": []}
    if model_type not in target.model_types:
        reason = (f"{target.name}: no mapping for model_type {model_type!r} here "
                  f"(mapped: {', '.join(sorted(target.model_types))})")
        figures["reason"] = reason
        return [make_finding("CG303", where, reason)], figures
    found = find_environment(target, python)
    worker_python, extra_path = found.python, found.path
    figures["environment"] = found.figures()
    stored = stored_dtype(src)
    low = low_dtype({"torch": stored})
    passes = ["F32", *([low] if low else [])]
    loads = [load for load in target.loads if not load.when_stored or stored in load.when_stored]
    input_ids = token_ids(config, seed)
    figures.update(available=True, model_type=model_type, stored_dtype={"file": stored}, flax_class=target.library,
                   torch_class=(config.get("architectures") or ["-"])[0], inputs={"input_ids": [BATCH, SEQ_LEN]})
    with tempfile.TemporaryDirectory(prefix="ckpt-guard-against-") as tmp:
        from guard.envs.worker import run_worker

        checkpoint = src.resolve()
        findings: list[Finding] = []
        if target.converts_to:  # the library reads its own format: the file converted by our converter first
            from guard.against.maxtext_tree import convert_first

            if converted is None:
                converted, findings, figures["conversion"] = convert_first(src, Path(tmp) / "converted")
                if converted is None:
                    figures["passed"] = False
                    return findings, figures
            checkpoint = converted.resolve()
        answer = run_worker(worker_python, {"target": target.name, "checkpoint": str(checkpoint),
                                            "config": config, "loads": [{"label": ld.label, "options": ld.options}
                                                                        for ld in loads],
                                            "inputs": {"input_ids": input_ids.tolist()}, "passes": passes,
                                            "drift": drift},
                            Path(tmp), extra_path=extra_path, env=_worker_env(target))
        figures.update(answer.get("backend", {}), library=answer.get("library"))
        from guard.envs.protocol import ProtocolError
        from guard.envs.worker import WorkerFailed
        from guard.parity.runs import Failed, Unavailable

        try:
            findings += _judge(target, loads, answer, config, src, input_ids, passes, stored, Path(tmp), figures,
                               where, checkpoint)
        except ProtocolError as exc:
            raise WorkerFailed(f"{worker_python} -m guard.worker: {exc}") from None
        except Failed as exc:  # PyTorch's side could not load the file: its finding
            figures["passed"] = False
            return [exc.finding], figures
        except Unavailable as exc:
            figures.update(available=False, reason=str(exc))
            return [make_finding("CG303", where, f"parity unavailable: {exc}")], figures
    figures["passed"] = not any(f.severity is Severity.error for f in findings)
    return findings, figures


def _judge(target: Target, loads: list[Load], answer: dict[str, Any], config: dict[str, Any], src: Path,
           input_ids: Any, passes: list[str], stored: str, tmp: Path, figures: dict[str, Any],
           where: str, checkpoint: Path) -> list[Finding]:
    from guard.against.maxtext_tree import compare_maxtext_tree
    from guard.against.tree import compare_tree
    from guard.envs.protocol import DRIFT_PASS, read_array
    from guard.parity.accelerator import drift_figures
    from guard.parity.verdict import compare_runs

    file_tensors = _file_tensors(src)
    torch_runs = _torch_runs(src, config, input_ids, passes)
    conventional: dict[str, Any] = {}  # the target's conventional reference, computed once when first needed
    exact = next((ld for ld in loads if ld.label == target.exact_load), None)
    findings: list[Finding] = []
    figures["loads"] = {}
    for load, record in zip(loads, answer["loads"], strict=True):
        who = f"{target.name} {target.version} ({load.label}: {load.says})"
        avoid = exact.says if exact is not None and load is not exact else None
        if record["error"]:
            hint = f"; {avoid} avoids it" if avoid else ""
            findings.append(make_finding("CG302", where, f"{who} cannot load this checkpoint: {record['error']}{hint}"))
            figures["loads"][load.label] = {"error": record["error"]}
            continue
        held = {p["name"]: partial(read_array, p, tmp) for p in record["parameters"]}
        if target.converts_to:
            tree_findings, tree_figures = compare_maxtext_tree(target, load.label, avoid, checkpoint, file_tensors,
                                                               held, where=where)
        else:
            tree_findings, tree_figures = compare_tree(target, load.label, avoid, config, file_tensors, held,
                                                       where=where)
        findings += tree_findings
        figures["loads"][load.label] = {"options": load.options, "tree": tree_figures}
        runs = dict(torch_runs)
        for dtype, outputs in record["outputs"].items():
            label = {"F32": "flax:fp32", DRIFT_PASS: "flax:fp32:default"}.get(dtype, "flax:stored")
            runs[label] = {k: read_array(v, tmp) for k, v in outputs.items()}
        if "flax:fp32:default" in runs:  # a figure beside the verdict, as parity's; the first load's heads the report
            drift = drift_figures(runs.pop("flax:fp32:default"), runs["flax:fp32"], runs["torch:fp32"])
            figures["loads"][load.label]["default_precision_drift"] = drift
            figures.setdefault("default_precision_drift", {**drift, "load": load.label})
        layers = int(config["num_hidden_layers"])
        comparisons = compare_runs(runs, {"torch": stored, "flax": stored}, layers=layers)
        conventions = _conventions_comparison(target, comparisons[0], runs, layers,
                                              lambda: _conventional(conventional, target, src, config, input_ids))
        exact_tree = not tree_findings  # every parameter bit-exact after the mapping: the file is not the cause
        for comp in comparisons:  # a failing one names what the library is known to do differently there
            for finding in forward_findings(target, load, comp, config, who=who, where=where, exact_tree=exact_tree):
                findings.append(_judged_by_conventions(finding, conventions, target)
                                if comp is comparisons[0] and conventions is not None else finding)
        if conventions is not None:
            comparisons.insert(1, conventions)
        for comp in comparisons:  # one report holds every load's comparisons
            comp["name"] = f"{load.label}: {comp['name']}"
        figures["comparisons"] += comparisons
    return findings


def forward_findings(target: Target, load: Load, comp: dict[str, Any], config: dict[str, Any], *, who: str,
                     where: str, exact_tree: bool) -> list[Finding]:
    """A forward comparison's findings (none where it passed), each naming the causes the target's row knows
    for it (``guard.against.causes``)."""
    from guard.against.causes import known_causes
    from guard.parity.verdict import comparison_findings

    causes = known_causes(target, config, dict(load.options), (comp["tolerance"] or {}).get("dtype", ""))
    return [make_finding(f.code, where, forward_message(f"{who} forward: {f.message}", causes,
                                                        exact_tree=exact_tree, target=target))
            for f in comparison_findings([comp], where=where)]


def forward_message(failure: str, causes: tuple[str, ...], *, exact_tree: bool, target: Target) -> str:
    """A failing forward comparison's message: where every parameter is bit-exact it says so, and points at the
    stack's configuration (the causes its row knows, else that none is known), not at the file."""
    if not exact_tree:
        return "; ".join((failure, *causes))
    if causes:
        return f"{failure}; every parameter bit-exact, the forward differs: {'; '.join(causes)}"
    return (f"{failure}; every parameter bit-exact, the forward differs: {target.name}'s forward or its "
            "configuration, for a cause not known here (the file's weights are as stored)")


def _conventional(cache: dict[str, Any], target: Target, src: Path, config: dict[str, Any],
                  input_ids: Any) -> dict[str, Any] | None:
    if "outputs" not in cache:
        cache["outputs"] = resolve(target.conventional_reference)(src, config, input_ids)
    return cache["outputs"]


def _conventions_comparison(target: Target, fp32: dict[str, Any], runs: dict[str, dict[str, Any]], layers: int,
                            reference: Any) -> dict[str, Any] | None:
    """A failed fp32 comparison, made again against transformers' forward with the target's declared
    conventions in it (the row's ``conventional_reference``); None where the target has none or none apply."""
    from guard.parity import metrics as pm
    from guard.parity.verdict import fixed_comparison

    if not target.conventional_reference or fp32["passed"] or "flax:fp32" not in runs:
        return None
    ref = reference()
    if ref is None:
        return None
    tol, other = pm.tolerance_for(layers=layers), runs["flax:fp32"]
    outputs = {name: pm.compare_output(name, ref[name], other[name], tie=tol.max_rel) for name in ref if name in other}
    return fixed_comparison(f"fp32 with {target.name}'s conventions", "torch:fp32+conventions", "flax:fp32",
                            outputs, tol)


def _judged_by_conventions(finding: Finding, conventions: dict[str, Any], target: Target) -> Finding:
    """The fp32 miss, judged again: within the bound of the conventional reference, it is the target's declared
    conventions only (a warning, as the conversion's declared roundings are); beyond it, something else too."""
    figures: dict[str, Any] = conventions["outputs"].get("logits") or next(iter(conventions["outputs"].values()), {})
    value, bound = figures.get("max_rel", float("inf")), conventions["tolerance"]["max_rel"]
    if conventions["passed"]:
        return finding._replace(severity=Severity.warning, message=(
            f"{finding.message}; with those conventions in transformers' fp32 forward it agrees (max_rel = "
            f"{value:.3g} <= {bound:.3g}): {target.name}'s declared conventions, nothing else"))
    return finding._replace(message=(
        f"{finding.message}; it misses transformers' fp32 forward with those conventions in it too (max_rel = "
        f"{value:.3g} > {bound:.3g}): something else differs"))


def _worker_env(target: Target) -> dict[str, str]:
    env = target.environment_row
    return dict(env.env) if env is not None else {}


def token_ids(config: dict[str, Any], seed: int) -> Any:
    """Seeded ids that avoid the special tokens (they change masks and positions in some models)."""
    import numpy as np

    vocab = int(config["vocab_size"])
    specials = {config.get(k) for k in ("pad_token_id", "bos_token_id", "eos_token_id")}
    allowed = np.setdiff1d(np.arange(vocab), [s for s in specials if isinstance(s, int)])
    return np.random.default_rng(seed).choice(allowed, size=(BATCH, SEQ_LEN)).astype(np.int32)


def _torch_runs(src: Path, config: dict[str, Any], input_ids: Any, passes: list[str]) -> dict[str, dict[str, Any]]:
    """transformers' PyTorch forward of the same file: fp32 (upcast exactly) and the stored dtype."""
    import transformers

    from guard.parity.runs import run_torch

    cls = getattr(transformers, (config.get("architectures") or [""])[0], None)
    if cls is None:
        raise UsageError(f"{src}: config.json names no architecture this transformers has")
    runs = {}
    for dtype in passes:
        outputs = run_torch(cls, src, dtype, {"input_ids": input_ids})
        runs["torch:fp32" if dtype == "F32" else "torch:stored"] = {"logits": outputs["logits"]}
    return runs


def _file_tensors(src: Path) -> dict[str, Any]:
    """name -> a reader of the file's tensor in its stored dtype (read when compared, not before)."""
    from guard.parity.weights import CheckpointWeights, NotStreamable

    try:
        weights = CheckpointWeights(src, "torch", separator=".")
    except NotStreamable as exc:
        raise UsageError(f"{src}: {exc}") from None
    return {name: partial(weights.load, name) for name in weights.tensors}


def _config(src: Path) -> dict[str, Any]:
    try:
        config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{src / 'config.json'}: {exc}") from None
    if not isinstance(config, dict):
        raise UsageError(f"{src / 'config.json'}: not a JSON object")
    return config
