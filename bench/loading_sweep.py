"""The full sweep: every class of the table of architectures, saved tiny by transformers and scanned.

For each (model_type, class) with a row in ``guard/inventory/architectures.bin``: a tiny config (the type's
sample config where the table was fitted on one, else its default with the layer counts two and every size of
64 or more divided by 16 where that divides it), the class built and written by its own ``save_pretrained``,
then scanned once as saved and once per planted defect:

  * as saved: zero loading findings (CG123-CG125; a CG127 note counts against it too: the check did not run).
    Where the scan finds something, transformers' own ``from_pretrained(output_loading_info=True)`` is asked
    too, and the class is counted as a false finding only where transformers reports nothing;
  * a parameter removed (a layer's, else the first weight): CG123 found;
  * a stray tensor added: CG124 found;
  * a layer added (the last layer's tensors copied one index on; where the file has layers): CG124 found;
  * a sub-model removed (every tensor under a ``Row.sub_models`` prefix that config.json declares): CG123 found.

The rows are judged alone (``CKPT_GUARD_NO_BUILD=1``: no class is built from a file's config).  A class that
cannot be built tiny, or saved, is counted apart with its reason.  Run it once per table regeneration, from a
checkout (no install needed: transformers, torch and safetensors importable, no network):

    PYTHONPATH=. python bench/loading_sweep.py --workers 12 --out /tmp/sweep
    PYTHONPATH=. python bench/loading_sweep.py --types llama,bert --out /tmp/sweep-some

Each class's result is appended to ``OUT/results.jsonl`` as it finishes; a second run with the same ``--out``
resumes (the classes there are not swept again; ``--fresh`` starts over).  ``OUT/summary.json`` holds the
figure, which is printed last (classes swept, clean as saved, each defect found, time) and goes in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without ckpt-guard installed
    sys.path.insert(0, str(ROOT))
LOADING = ("CG123", "CG124", "CG125", "CG127")
DEFECTS = ("removed", "stray", "layer_added", "sub_model")
ENV = {"CKPT_GUARD_NO_BUILD": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false",
       "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
MAX_PARAMETERS = 60_000_000


# how a default config is made tiny, tried in turn until the class builds within MAX_PARAMETERS: its layer counts
# two (the per-layer lists cut with them) and every size of 64 or more divided by 16; the counts alone; the sizes
# alone; as it is
VARIANTS = ((True, True), (True, False), (False, True), (False, False))


def tiny_config(model_type: str, variant: tuple[bool, bool] = VARIANTS[0]) -> Any:
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
    import architectures_table as generator

    plan = generator.Plan(model_type)
    if plan.sample:  # the sample configs the table's own rows were fitted on
        return generator._config(model_type, {})
    shrink, divide = variant
    data = json.loads(json.dumps(plan.default))
    overrides: dict[str, int] = {}
    for key in plan.sized(data) if divide else ():
        head, _, rest = key.rpartition(".")
        value = (data[head] if head else data)[rest]
        if value >= 64 and value % 16 == 0 and not generator.LAYER_COUNT.match(rest) and "heads" not in rest \
                and "experts" not in rest:
            overrides[key] = value // 16
    return plan.config(overrides, shrink=shrink)


def _tiny_model(model_type: str, class_name: str) -> Any:
    """The class built from the first tiny config it accepts (sized on the meta device first), or why none."""
    import torch
    import transformers

    cls = getattr(transformers, class_name)
    first: str | None = None
    for variant in VARIANTS:
        try:
            config = tiny_config(model_type, variant)
            with torch.device("meta"):
                params = sum(p.numel() for p in cls(config).parameters())
            if params > MAX_PARAMETERS:
                first = first or f"{params / 1e6:.0f}M parameters at its smallest"
                continue
            torch.manual_seed(0)
            return cls(config)
        except Exception as exc:  # noqa: BLE001  the next variant; the first reason is kept
            first = first or _why(exc)
        if generator_sample(model_type):
            break  # one sample config: no variant
    return first or "no tiny config"


def generator_sample(model_type: str) -> bool:
    import architectures_table as generator

    return model_type in generator.CLASSES


def scan_codes(root: Path) -> list[dict[str, Any]]:
    from guard.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(["scan", "--format", "json", "--no-summary", str(root)])
    return [f for f in json.loads(out.getvalue())["findings"] if f["code"] in LOADING]


def _why(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:160]}"


def _theirs(root: Path, class_name: str) -> str:
    """What transformers' own loading reports for the folder as saved ("" where it reports nothing)."""
    import transformers

    try:
        _, info = getattr(transformers, class_name).from_pretrained(root, output_loading_info=True)
    except Exception as exc:  # noqa: BLE001  its refusal is its report
        return f"raises {_why(exc)}"
    return "; ".join(f"{key}: {sorted(info[key])[:4]}" for key in ("missing_keys", "unexpected_keys",
                                                                    "mismatched_keys") if info.get(key))


def _layer_added(state: dict[str, Any]) -> dict[str, Any] | None:
    from guard.inventory.architectures import layer_template

    containers: dict[str, set[int]] = {}
    for name in state:
        template, layer = layer_template(name)
        if layer is not None:
            containers.setdefault(template.split(".{L}.", 1)[0], set()).add(layer)
    if not containers:
        return None
    container = max(containers, key=lambda c: sum(1 for n in state if n.startswith(c + ".")))
    last = max(containers[container])
    lead = f"{container}.{last}."
    added = {f"{container}.{last + 1}.{k[len(lead):]}": v.clone() for k, v in state.items() if k.startswith(lead)}
    return {**state, **added}


def _sub_model_removed(model_type: str, class_name: str, config: dict[str, Any], state: dict[str, Any]
                       ) -> tuple[str, dict[str, Any]] | None:
    from guard.inventory.rows import rows_for

    row = (rows_for(model_type) or {}).get(class_name)
    renames = [(re.compile(a), b) for a, b in getattr(row, "renames", ())]

    def loaded_as(name: str) -> str:  # the file's name as transformers renames it at load (the row's prefixes)
        for pattern, target in renames:
            name = pattern.sub(target, name)
        return name

    for prefix, key in getattr(row, "sub_models", ()):
        if key == "text_config" or not isinstance(config.get(key), dict):
            continue
        kept = {k: v for k, v in state.items() if not loaded_as(k).startswith(prefix + ".")}
        if len(kept) < len(state):
            return prefix, kept
    return None


def sweep_class(task: tuple[str, str, str]) -> tuple[str, dict[str, Any]]:
    """One class: built tiny, saved, scanned as saved and with each defect planted (in a worker)."""
    import signal
    import warnings

    model_type, class_name, scratch = task
    key = f"{model_type}/{class_name}"
    warnings.filterwarnings("ignore")
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(dir=scratch))
    marker = Path(scratch) / "started" / root.name  # while it runs: a worker that dies is known by it
    if marker.parent.is_dir():
        marker.write_text(key)

    def _late(signum: int, frame: Any) -> None:
        raise TimeoutError("over the per-class time limit")

    signal.signal(signal.SIGALRM, _late)
    signal.alarm(int(os.environ.get("LOADING_SWEEP_PER_CLASS_S", "600")))
    try:
        return key, _sweep(model_type, class_name, root, started)
    except Exception as exc:  # noqa: BLE001  counted apart, with its reason
        return key, {"error": _why(exc), "seconds": round(time.perf_counter() - started, 2)}
    finally:
        signal.alarm(0)
        shutil.rmtree(root, ignore_errors=True)
        marker.unlink(missing_ok=True)


def _sweep(model_type: str, class_name: str, root: Path, started: float) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file, save_file

    model = _tiny_model(model_type, class_name)
    if isinstance(model, str):
        return {"left_out": model}
    try:
        model.save_pretrained(root)
    except Exception as exc:  # noqa: BLE001  counted apart, with its reason
        return {"left_out": f"save_pretrained: {_why(exc)}"}
    del model
    found = scan_codes(root)
    result: dict[str, Any] = {"as_saved": [f"{f['code']} {f.get('tensor')}: {f['message'][:200]}" for f in found]}
    if found:
        result["transformers_as_saved"] = _theirs(root, class_name)
    files = sorted(root.glob("*.safetensors"))
    if len(files) != 1:
        result["planted"] = f"{len(files)} safetensors files, not one: no defect planted"
        result["seconds"] = round(time.perf_counter() - started, 2)
        return result
    state = load_file(files[0])
    written = json.loads((root / "config.json").read_text())

    def planted(defect: str, tensors: dict[str, Any], code: str, what: str) -> None:
        save_file({k: v.contiguous() for k, v in tensors.items()}, files[0], metadata={"format": "pt"})
        codes = {f["code"] for f in scan_codes(root)}
        # a CG127 note alone: the row could not vouch and no class was built (the sweep judges the rows alone)
        result[defect] = {"what": what, "found": code in codes, "note": codes == {"CG127"}}

    layered = [k for k in state if ".1." in k and k.endswith("weight")] or [k for k in state if k.endswith("weight")]
    if layered:
        removed = sorted(layered)[0]
        planted("removed", {k: v for k, v in state.items() if k != removed}, "CG123", removed)
    planted("stray", {**state, "stray_head.weight": torch.zeros(2, 2)}, "CG124", "stray_head.weight")
    more = _layer_added(state)
    if more is not None:
        planted("layer_added", more, "CG124", f"{len(more) - len(state)} tensors")
    stripped = _sub_model_removed(model_type, class_name, written, state)
    if stripped is not None:
        planted("sub_model", stripped[1], "CG123", stripped[0])
    result["seconds"] = round(time.perf_counter() - started, 2)
    return result


def run(tasks: list[tuple[str, str, str]], workers: int, scratch: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each task's (class, result) as it finishes: in this process, or in ``workers`` processes forked from a
    server that imported torch, transformers and the scan once (the workers replaced after 16 classes each:
    the model modules a class imports stay).  A worker that dies (killed for memory, a crash in native code) takes
    the pool with it: the classes it was sweeping are counted apart and the rest go on in a fresh pool."""
    if workers <= 1:
        yield from map(sweep_class, tasks)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "transformers", "guard.cli", "safetensors.torch"])
    started = scratch / "started"
    started.mkdir(exist_ok=True)
    left = list(tasks)
    while left:
        # a fresh pool for each 16 classes a worker (the model modules a class imports stay in its worker; the
        # executor's own max_tasks_per_child hangs once every worker has exited, on Python 3.11)
        batch = left[:16 * workers]
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            futures = {pool.submit(sweep_class, task): task for task in batch}
            try:
                for future in as_completed(futures):
                    key, result = future.result()
                    left.remove(futures[future])
                    yield key, result
            except BrokenProcessPool:
                dead = [marker.read_text() for marker in started.iterdir()]  # being swept when the pool broke
                for marker in started.iterdir():
                    marker.unlink()
                if not dead:  # (it died before it said which): the batch's first unfinished class, so it ends
                    dead = [next(f"{t[0]}/{t[1]}" for t in batch if t in left)]
                for key in dead:
                    left = [t for t in left if f"{t[0]}/{t[1]}" != key]
                    yield key, {"error": "its worker died (killed for memory, or a crash in native code)"}


def figures(results: dict[str, dict[str, Any]], in_table: int, seconds: float, workers: int) -> dict[str, Any]:
    swept = {k: v for k, v in results.items() if "left_out" not in v and "error" not in v}
    not_clean = {k: v for k, v in swept.items() if v["as_saved"]}
    out: dict[str, Any] = {
        "classes_in_table": in_table, "classes": len(results), "swept": len(swept),
        "clean_as_saved": len(swept) - len(not_clean),
        "not_clean_transformers_agrees": sum(bool(v.get("transformers_as_saved")) for v in not_clean.values()),
        "false_errors": sum(not v.get("transformers_as_saved") and any(not f.startswith("CG127") for f in v["as_saved"])
                            for v in not_clean.values()),
        "notes_as_saved": sum(all(f.startswith("CG127") for f in v["as_saved"]) for v in not_clean.values()),
        "seconds": round(seconds, 1), "workers": workers,
        "class_seconds": round(sum(v.get("seconds", 0.0) for v in results.values()), 1),
    }
    for defect in DEFECTS:
        tried = [v[defect] for v in swept.values() if defect in v]
        out[f"{defect}_planted"] = len(tried)
        out[f"{defect}_found"] = sum(t["found"] for t in tried)
        out[f"{defect}_note"] = sum(bool(t.get("note")) for t in tried)
    out["not_clean"] = {k: {"scan": v["as_saved"], "transformers": v.get("transformers_as_saved", "")}
                        for k, v in sorted(not_clean.items())}
    out["missed"] = {k: {d: v[d]["what"] for d in DEFECTS if d in v and not v[d]["found"] and not v[d].get("note")}
                     for k, v in sorted(swept.items())
                     if any(d in v and not v[d]["found"] and not v[d].get("note") for d in DEFECTS)}
    out["not_judged"] = sorted(k for k, v in swept.items() if any(v.get(d, {}).get("note") for d in DEFECTS))
    out["left_out"] = {k: v.get("left_out") or v["error"] for k, v in sorted(results.items()) if k not in swept}
    return out


def summary_line(f: dict[str, Any]) -> str:
    defects = ", ".join(f"{d.replace('_', ' ')} found {f[f'{d}_found']} of {f[f'{d}_planted']}"
                        + (f" ({f[f'{d}_note']} a note: the row cannot vouch)" if f[f"{d}_note"] else "")
                        for d in DEFECTS)
    return (f"{f['swept']} of {f['classes']} classes saved tiny and scanned ({f['classes_in_table']} in the table, "
            f"{len(f['left_out'])} left out); zero findings as saved {f['clean_as_saved']} of {f['swept']}, "
            f"{f['false_errors']} with a false finding (where transformers reports nothing), {f['notes_as_saved']} "
            f"with a note alone (the row could not vouch); {defects}; {f['seconds']} s with {f['workers']} worker(s)")


def main(argv: list[str]) -> int:
    os.environ.update(ENV)
    import warnings

    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--types", help="comma-separated model_types (default: every one in the table)")
    parser.add_argument("--limit", type=int, default=0, help="at most this many classes (this run)")
    parser.add_argument("--workers", type=int, default=1, help="classes swept at once, each in its own process")
    parser.add_argument("--per-class-s", type=int, default=600, help="a class's time limit (then counted apart)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "loading_sweep"),
                        help="folder for results.jsonl (resumed from) and summary.json")
    parser.add_argument("--fresh", action="store_true", help="start over: the folder's results are not reused")
    parser.add_argument("--summary-only", action="store_true", help="sweep nothing: the figure of what is done")
    args = parser.parse_args(argv)
    os.environ["LOADING_SWEEP_PER_CLASS_S"] = str(args.per_class_s)
    from guard.inventory.rows import model_types, rows_for

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    journal = out / "results.jsonl"
    if args.fresh and journal.exists():
        journal.unlink()
    types = [t for t in args.types.split(",") if t] if args.types else model_types()
    wanted = [(t, c) for t in types for c in rows_for(t) or {}]
    results: dict[str, dict[str, Any]] = {}
    spans: list[list[float]] = []  # each run's start and its last result's time: the wall time of a resumed sweep
    used: set[int] = set()  # the workers of each run
    if journal.exists():
        for line in journal.read_text().splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                record = json.loads(line)
                if "run" in record:
                    spans.append([record["run"], record["run"]])
                    used.add(int(record.get("workers", 1)))
                    continue
                results[record["class"]] = record["result"]
                if spans and "at" in record:
                    spans[-1][1] = record["at"]
    todo = [(t, c) for t, c in wanted if f"{t}/{c}" not in results]
    if args.limit:
        todo = todo[:args.limit]
    if args.summary_only:
        todo = []
    print(f"{len(wanted)} classes over {len(types)} model_types; {len(wanted) - len(todo)} done already, "
          f"{len(todo)} to sweep with {args.workers} worker(s) -> {out}", flush=True)
    with tempfile.TemporaryDirectory(prefix="loading-sweep-") as scratch, journal.open("a") as keep:
        tasks = [(t, c, scratch) for t, c in todo]
        if tasks:
            spans.append([time.time(), time.time()])
            used.add(args.workers)
            keep.write(json.dumps({"run": spans[-1][0], "workers": args.workers}) + "\n")
        for n, (key, result) in enumerate(run(tasks, args.workers, Path(scratch)), 1):
            results[key] = result
            spans[-1][1] = time.time()
            keep.write(json.dumps({"class": key, "result": result, "at": spans[-1][1]}) + "\n")
            keep.flush()
            state = ("left out: " + result["left_out"] if "left_out" in result else
                     "error: " + result["error"] if "error" in result else
                     ("clean" if not result["as_saved"] else f"{len(result['as_saved'])} finding(s) as saved")
                     + "".join(f", {d} " + ("found" if result[d]["found"] else "a note" if result[d].get("note")
                                             else "MISSED") for d in DEFECTS if d in result))
            print(f"[{n}/{len(todo)}] {key}: {state} ({result.get('seconds', '-')} s)", flush=True)
    seconds = sum(end - start for start, end in spans)  # every run's, a resumed sweep's included
    keys = {f"{t}/{c}" for t, c in wanted}
    considered = {k: v for k, v in results.items() if k in keys}
    figure = figures(considered, len(wanted), seconds, max(used, default=args.workers))
    (out / "summary.json").write_text(json.dumps({"figures": figure}, indent=1))
    print(summary_line(figure))
    for key, why in list(figure["not_clean"].items())[:40]:
        print(f"  not clean as saved: {key}: {why['scan'][:2]} (transformers: {why['transformers'] or 'nothing'})")
    for key, what in list(figure["missed"].items())[:40]:
        print(f"  missed: {key}: {what}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
