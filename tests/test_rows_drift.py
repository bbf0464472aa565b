"""The table's rows against the transformers installed: regenerated and compared (`make test-latest` runs it on
the newest release).  A row that changed fails: users on that release would get a wrong verdict, and
`.venv/bin/python scripts/architectures_table.py` regenerates the table (CONTRIBUTING).  A class that is new
(named by the installed transformers' auto mappings, and neither a row nor a class left out with its reason)
is listed, and does not fail.

Regenerating every model_type takes about 35 CPU-minutes (173 s on 13 CPUs), so the rows regenerated are one
model_type per layout family the table holds (a decoder, Falcon's flags, a per-expert and a fused MoE, an encoder, an
encoder-decoder, a vision-language model, speech, vision, a state-space model); every class is listed for
newness, which reads names only.  ``CKPT_GUARD_DRIFT_TYPES=all`` (or a comma-separated list) regenerates those
types instead, with a worker per CPU."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
SAMPLE = ("llama", "falcon", "qwen3_moe", "gpt_oss", "bert", "t5", "gemma3", "whisper", "vit", "mamba")
TYPES_ENV = "CKPT_GUARD_DRIFT_TYPES"


def _generator() -> object:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import architectures_table as generator
    finally:
        sys.path.remove(str(SCRIPTS))
    return generator


def installed_classes() -> dict[str, set[str]]:
    """model_type -> the classes the installed transformers' auto mappings name and export (names only: no
    model module is imported)."""
    from transformers.models.auto import modeling_auto

    exported = set(dir(transformers))
    found: dict[str, set[str]] = {}
    for mapping in (n for n in dir(modeling_auto) if n.startswith("MODEL_") and n.endswith("_MAPPING_NAMES")):
        for model_type, value in getattr(modeling_auto, mapping).items():
            for class_name in value if isinstance(value, (list, tuple)) else (value,):
                if class_name in exported:
                    found.setdefault(model_type, set()).add(class_name)
    return found


def new_classes(installed: dict[str, set[str]]) -> list[str]:
    """The installed classes the table neither has a row for nor leaves out with a reason."""
    from guard.inventory.rows import figures as rows_figures, rows_for

    figures = rows_figures()
    left = set(figures.get("left_out", {})) if isinstance(figures, dict) else set()
    return sorted(f"{t}/{c}" for t, classes in installed.items() for c in classes
                  if c not in (rows_for(t) or {}) and f"{t}/{c}" not in left)


def regenerated_types() -> list[str]:
    from guard.inventory.rows import model_types

    wanted = os.environ.get(TYPES_ENV, "")
    table = model_types()
    if wanted == "all":
        return table
    if wanted:
        return [t for t in wanted.split(",") if t in table]
    return [t for t in SAMPLE if t in table]


@pytest.mark.slow
def test_the_rows_are_what_the_installed_transformers_builds(capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import CONFIG_MAPPING

    from guard.inventory.rows import rows_for

    generator = _generator()
    installed = installed_classes()
    new = new_classes(installed)
    types = [t for t in regenerated_types() if t in CONFIG_MAPPING]
    workers = (os.cpu_count() or 1) if os.environ.get(TYPES_ENV) else 1
    fresh, figures = generator.generate(types, workers=workers)  # type: ignore[attr-defined]  # the script's module
    changed, also_new = generator.compare(fresh, types)  # type: ignore[attr-defined]  # the script's module
    # a class of the table the installed transformers still names but no longer builds: its row is not vouched for
    gone = sorted(f"{t}/{c}" for t in types for c in rows_for(t) or {}
                  if c in installed.get(t, set()) and c not in fresh.get(t, {}))
    with capsys.disabled():
        for name in sorted(set(new) | set(also_new)):
            print(f"\nnew in transformers {transformers.__version__}: {name} (not in the table; not a failure)")
    assert not changed and not gone, (
        f"transformers {transformers.__version__} builds these classes otherwise than the table says: {changed}"
        + (f"; no longer builds {gone} ({ {k: v for k, v in figures['left_out'].items() if k in gone} })" if gone
           else "")
        + "; regenerate the table with `.venv/bin/python scripts/architectures_table.py` and review the difference")
    assert sum(len(c) for c in fresh.values()) >= len(types)  # something was generated, and compared


def test_a_changed_row_fails_and_a_new_class_is_listed() -> None:
    """The comparison itself, on the table's own rows: one row altered is a change, a class the table lacks is
    new, an equal row is neither."""
    from guard.inventory.rows import model_types, row_to_json, rows_for

    generator = _generator()
    model_type = model_types()[0]
    rows = rows_for(model_type) or {}
    assert rows
    fresh = {model_type: {c: row_to_json(r) for c, r in rows.items()}}
    assert generator.compare(fresh, [model_type]) == ([], [])  # type: ignore[attr-defined]  # the script's module
    first = next(iter(rows))
    altered = dict(fresh[model_type][first])
    altered["flat"] = [*altered["flat"], ["extra.weight", [1]]]
    fresh[model_type] = {**fresh[model_type], first: altered, "BrandNewClassForCausalLM": altered}
    changed, new = generator.compare(fresh, [model_type])  # type: ignore[attr-defined]  # the script's module
    assert changed == [f"{model_type}/{first}"]
    assert new == [f"{model_type}/BrandNewClassForCausalLM"]
    installed = {model_type: set(rows) | {"BrandNewClassForCausalLM"}, "brand_new_type": {"BrandNewModel"}}
    assert new_classes(installed) == sorted(["brand_new_type/BrandNewModel", f"{model_type}/BrandNewClassForCausalLM"])
