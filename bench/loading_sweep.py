"""The full sweep: every class of the table of architectures, saved tiny by transformers and scanned.

For each (model_type, class) with a row in ``guard/inventory/architectures.bin``: a tiny config (the type's
default, its layer counts two, every size of 64 or more divided by 16 where that divides it), the class built
and written by its own ``save_pretrained``, then scanned three times:

  * as saved: zero loading findings (CG123-CG125; a CG127 note counts against it too: the check did not run);
  * one parameter removed (a layer's, else the first weight): CG123 found;
  * a stray tensor added: CG124 found.

The rows are judged alone (``CKPT_GUARD_NO_BUILD=1``: no class is built from a file's config).  A class that
cannot be built tiny, or saved, is counted apart with its reason.  Run it once per table regeneration:

    .venv/bin/python bench/loading_sweep.py [--types llama,bert] [--limit N] [--out bench/out/loading_sweep.json]

The figure (classes swept, clean as saved, each defect found, time) goes in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOADING = ("CG123", "CG124", "CG125", "CG127")


def tiny_config(model_type: str) -> Any:
    sys.path.insert(0, str(ROOT / "scripts"))
    import architectures_table as generator

    plan = generator.Plan(model_type)
    if plan.sample:  # the sample configs the table's own rows were fitted on
        return generator._config(model_type, {})
    data = json.loads(json.dumps(plan.default))
    for key, value in plan.shrunk.items():
        head, _, rest = key.rpartition(".")
        (data[head] if head else data)[rest] = value
    for key in plan.sized(data):
        head, _, rest = key.rpartition(".")
        where = data[head] if head else data
        value = where[rest]
        if value >= 64 and value % 16 == 0 and not generator.LAYER_COUNT.match(rest) and "heads" not in rest \
                and "experts" not in rest:
            where[rest] = value // 16
    data.pop("transformers_version", None)
    return plan.cls.from_dict(data)


def scan_codes(root: Path) -> list[dict[str, Any]]:
    from guard.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(["scan", "--format", "json", "--no-summary", str(root)])
    return [f for f in json.loads(out.getvalue())["findings"] if f["code"] in LOADING]


def sweep_class(model_type: str, class_name: str, folder: Path) -> dict[str, Any]:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    started = time.perf_counter()
    try:
        config = tiny_config(model_type)
        torch.manual_seed(0)
        model = getattr(transformers, class_name)(config)
        params = sum(p.numel() for p in model.parameters())
        if params > 60_000_000:
            return {"left_out": f"{params / 1e6:.0f}M parameters tiny"}
        root = folder / class_name
        model.save_pretrained(root)
    except Exception as exc:  # noqa: BLE001  counted apart, with its reason
        return {"left_out": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"}
    result: dict[str, Any] = {"as_saved": [f"{f['code']} {f.get('tensor')}" for f in scan_codes(root)]}
    files = sorted(root.glob("*.safetensors"))
    if len(files) != 1:
        result["planted"] = "not one safetensors file"
        return result
    state = load_file(files[0])
    layered = [k for k in state if ".1." in k and k.endswith("weight")] or [k for k in state if k.endswith("weight")]
    removed = sorted(layered)[0]
    state_removed = {k: v for k, v in state.items() if k != removed}
    save_file(state_removed, files[0], metadata={"format": "pt"})
    result["removed"] = removed
    result["removed_found"] = any(f["code"] == "CG123" for f in scan_codes(root))
    save_file({**state, "stray_head.weight": torch.zeros(2, 2)}, files[0], metadata={"format": "pt"})
    result["stray_found"] = any(f["code"] == "CG124" for f in scan_codes(root))
    result["seconds"] = round(time.perf_counter() - started, 2)
    shutil.rmtree(root, ignore_errors=True)
    return result


def main(argv: list[str]) -> int:
    import warnings

    warnings.filterwarnings("ignore")
    os.environ["CKPT_GUARD_NO_BUILD"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", help="comma-separated model_types (default: every one in the table)")
    parser.add_argument("--limit", type=int, default=0, help="at most this many classes")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "loading_sweep.json"))
    args = parser.parse_args(argv)
    from guard.inventory.rows import model_types, rows_for

    types = args.types.split(",") if args.types else model_types()
    started = time.perf_counter()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for model_type in types:
            for class_name in rows_for(model_type) or {}:
                if args.limit and len(results) >= args.limit:
                    break
                results[f"{model_type}/{class_name}"] = sweep_class(model_type, class_name, Path(scratch))
                print(f"{model_type}/{class_name}: {results[f'{model_type}/{class_name}']}", flush=True)
    swept = {k: v for k, v in results.items() if "left_out" not in v}
    figures = {
        "classes": len(results), "swept": len(swept),
        "clean_as_saved": sum(not v["as_saved"] for v in swept.values()),
        "removed_found": sum(bool(v.get("removed_found")) for v in swept.values()),
        "stray_found": sum(bool(v.get("stray_found")) for v in swept.values()),
        "seconds": round(time.perf_counter() - started, 1),
        "not_clean": {k: v["as_saved"] for k, v in swept.items() if v["as_saved"]},
        "missed": {k: v.get("removed") for k, v in swept.items() if not v.get("removed_found")
                   or not v.get("stray_found")},
        "left_out": {k: v["left_out"] for k, v in results.items() if "left_out" in v},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"figures": figures, "results": results}, indent=1))
    print(f"{figures['swept']} of {figures['classes']} classes saved tiny; clean as saved {figures['clean_as_saved']}, "
          f"a removed parameter found {figures['removed_found']}, a stray tensor found {figures['stray_found']}; "
          f"{figures['seconds']} s -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
