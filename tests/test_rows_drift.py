"""The table's rows against the transformers installed: regenerated and compared (`make test-latest` runs it on
the newest release).  A row that changed fails: users on that release would get a wrong verdict, and
`.venv/bin/python scripts/architectures_table.py` regenerates the table.  A class that is new is listed, and
does not fail.  A sample of the layout families keeps it to a minute: a decoder, a per-expert MoE, an encoder,
an encoder-decoder, a vision-language model and Falcon's flags."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
SAMPLE = ("llama", "qwen3_moe", "bert", "t5", "gemma3", "falcon")


@pytest.mark.slow
def test_the_rows_are_what_the_installed_transformers_builds(capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import architectures_table as generator
    finally:
        sys.path.remove(str(SCRIPTS))
    from transformers import CONFIG_MAPPING

    types = [t for t in SAMPLE if t in CONFIG_MAPPING]
    fresh, figures = generator.generate(types, workers=1)
    changed, new = generator.compare(fresh, types)
    with capsys.disabled():
        for name in new:
            print(f"\nnew in transformers {transformers.__version__}: {name} (not in the table; not a failure)")
    assert not changed, (
        f"transformers {transformers.__version__} builds these classes otherwise than the table says: {changed}; "
        "regenerate the table with `.venv/bin/python scripts/architectures_table.py` and review the difference")
    assert sum(len(c) for c in fresh.values()) >= len(types)  # something was generated, and compared
