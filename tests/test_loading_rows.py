"""The table's rows as package data, and the class built from the file's own config where the row cannot vouch.

A row says which config fields change the modules its class builds (``Row.flags``).  A config that sets one
otherwise (Falcon-40B's ``new_decoder_architecture`` and ``ffn_hidden_size``) is judged against the class built
from that config on the meta device (``guard.inventory.build_rows``, in a subprocess, cached by the config's
hash), or, where transformers cannot build it, not judged (a note), never with a false error.  Each verdict
is checked against ``from_pretrained(output_loading_info=True)`` on files transformers' own save_pretrained wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from scanning import json_scan  # noqa: E402

from guard.inventory import build_rows, rows  # noqa: E402
from guard.inventory.architectures import table_row  # noqa: E402

LOADING = {"CG123", "CG124", "CG125", "CG127"}
# Falcon-40B's and 180B's layout: the new decoder, grouped kv heads, its own feed-forward width
FALCON_40B = dict(hidden_size=32, num_attention_heads=4, num_kv_heads=2, vocab_size=96, num_hidden_layers=2,
                  new_decoder_architecture=True, parallel_attn=True, ffn_hidden_size=24, bias=False)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh user cache: the builder's answers land here."""
    home = tmp_path / "cache"
    monkeypatch.setenv("CKPT_GUARD_HOME", str(home))
    monkeypatch.delenv(build_rows.NO_BUILD_ENV, raising=False)
    return home


def save(root: Path, class_name: str, **config: object) -> Path:
    model_type = getattr(transformers, class_name).config_class.model_type
    torch.manual_seed(0)
    getattr(transformers, class_name)(transformers.CONFIG_MAPPING[model_type](**config)).save_pretrained(root)
    return root


def verdict(root: Path, class_name: str) -> set[str]:
    """What transformers' own loading reports: CG123 missing, CG124 unexpected, CG125 it raised."""
    try:
        _, info = getattr(transformers, class_name).from_pretrained(root, output_loading_info=True)
    except RuntimeError as exc:
        assert "ignore_mismatched_sizes" in str(exc), exc
        return {"CG125"}
    return ({"CG123"} if info["missing_keys"] else set()) | ({"CG124"} if info["unexpected_keys"] else set())


def scanned(capsys: pytest.CaptureFixture[str], root: Path) -> tuple[set[str], list[dict]]:
    _, report = json_scan(capsys, str(root))
    found = [f for f in report["findings"] if f["code"] in LOADING]
    return {f["code"] for f in found}, found


def removed_is_cg123(capsys: pytest.CaptureFixture[str], root: Path, class_name: str, name: str) -> None:
    """``name`` taken out of the file: transformers reports it missing, and the scan says CG123 naming it."""
    state = load_file(root / "model.safetensors")
    del state[name]
    save_file(state, root / "model.safetensors", metadata={"format": "pt"})
    assert verdict(root, class_name) == {"CG123"}
    found, findings = scanned(capsys, root)
    assert found == {"CG123"} and findings[0]["tensor"] == name, findings

def test_falcon_40b_layout_is_judged_against_its_own_config(tmp_path: Path, cache: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    root = save(tmp_path / "falcon", "FalconForCausalLM", **FALCON_40B)
    assert verdict(root, "FalconForCausalLM") == set()
    found, findings = scanned(capsys, root)
    assert found == set(), findings  # no CG125 from 4*hidden_size, no CG124 for ln_attn / ln_mlp
    assert len(list((cache / "rows").glob("*.json"))) == 1  # the build, kept for the next scan
    # a defect planted in the same layout is found, as transformers reports it
    removed_is_cg123(capsys, root, "FalconForCausalLM", "transformer.h.1.ln_mlp.weight")


def test_the_cached_build_is_reused(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = json.loads((save(tmp_path / "falcon", "FalconForCausalLM", **FALCON_40B) / "config.json").read_text())
    first = table_row(config)
    assert not isinstance(first, str), first
    assert first[1].source == "built"  # type: ignore[attr-defined]  # a Row

    def no_build(*args: object) -> object:
        raise AssertionError("built again: the cache was not read")

    monkeypatch.setattr(build_rows, "_build_in_subprocess", no_build)
    assert table_row(config) == first
    changed = dict(config, ffn_hidden_size=40)  # another config is another key: built anew
    with pytest.raises(AssertionError, match="built again"):
        table_row(changed)


@pytest.mark.parametrize("why", ["turned off", "not installed"])
def test_a_row_that_cannot_vouch_is_a_note_never_an_error(tmp_path: Path, cache: Path, why: str,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    root = save(tmp_path / "falcon", "FalconForCausalLM", **FALCON_40B)
    if why == "turned off":
        monkeypatch.setenv(build_rows.NO_BUILD_ENV, "1")
    else:
        monkeypatch.setattr(build_rows, "transformers_version", lambda: None)
    found, findings = scanned(capsys, root)
    assert found == {"CG127"}, findings
    [note] = findings
    assert note["severity"] == "note" and "new_decoder_architecture=true" in note["message"]
    assert why in note["message"]


def test_a_config_the_class_cannot_build_is_a_note(tmp_path: Path, cache: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    root = save(tmp_path / "falcon", "FalconForCausalLM", **FALCON_40B)
    config = json.loads((root / "config.json").read_text())
    config["num_attention_heads"] = 5  # hidden_size 32 is not a multiple: the class refuses to build
    (root / "config.json").write_text(json.dumps(config))
    found, findings = scanned(capsys, root)
    assert found == {"CG127"} and "could not build FalconForCausalLM" in findings[0]["message"], findings


def test_a_buffer_in_the_file_is_loaded_not_dropped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """all-MiniLM-L6-v2 as sentence-transformers publishes it: BertModel's file holds ``embeddings.position_ids``,
    a non-persistent buffer transformers 5 loads with an empty report."""
    root = save(tmp_path / "minilm", "BertModel", hidden_size=32, intermediate_size=48, num_attention_heads=4,
                num_hidden_layers=2, vocab_size=96, max_position_embeddings=64, pad_token_id=0)
    state = load_file(root / "model.safetensors")
    assert "embeddings.position_ids" not in state  # save_pretrained leaves it out; older saves kept it
    state["embeddings.position_ids"] = torch.arange(64).unsqueeze(0)
    save_file(state, root / "model.safetensors", metadata={"format": "pt"})
    assert verdict(root, "BertModel") == set()
    found, findings = scanned(capsys, root)
    assert found == set(), findings
    # a stray tensor beside it is still dropped, as transformers reports it
    state["embeddings.stray.weight"] = torch.zeros(2)
    save_file(state, root / "model.safetensors", metadata={"format": "pt"})
    assert verdict(root, "BertModel") == {"CG124"}
    found, findings = scanned(capsys, root)
    assert found == {"CG124"} and "position_ids" not in findings[0]["message"], findings


def test_only_the_named_types_rows_are_read() -> None:
    """The data is read when a config names an architecture, one model_type's rows, without torch or transformers."""
    code = """
import json, sys
from guard.inventory import rows
from guard.inventory.architectures import table_row
assert not rows._ROWS and not rows._INDEX
found = table_row({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
print(json.dumps([found[0], sorted(rows._ROWS), "torch" in sys.modules, "transformers" in sys.modules]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert json.loads(out.stdout) == ["LlamaForCausalLM", ["llama"], False, False]


def test_the_data_round_trips_and_names_its_version(tmp_path: Path) -> None:
    index = rows.index()
    assert index["version"] == transformers.__version__  # the pinned wheel the rows were generated from
    for model_type in ("llama", "bert", "falcon"):
        for class_name, row in (rows.rows_for(model_type) or {}).items():
            assert rows.row_from_json(json.loads(json.dumps(rows.row_to_json(row)))) == row, class_name
    assert rows.rows_for("no-such-type") is None


LLAMA = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
             num_hidden_layers=2)


def test_a_finding_the_row_cannot_vouch_for_is_asked_of_the_class(tmp_path: Path, cache: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A config field that picks which layers are which (Jamba's attn_layer_period, mlp_layer_types), which the
    table's row does not follow: as saved nothing is built (the row finds nothing); with a defect the row's finding
    is asked of the class built from config.json, and where it cannot be built the check says it did not run."""
    root = save(tmp_path / "llama", "LlamaForCausalLM", **LLAMA)
    config = json.loads((root / "config.json").read_text())
    config["mlp_layer_types"] = ["dense", "dense"]  # kept by the config class; LlamaForCausalLM builds the same
    (root / "config.json").write_text(json.dumps(config))
    assert scanned(capsys, root)[0] == set()
    assert not (cache / "rows").exists()  # a healthy file never pays for the question
    removed_is_cg123(capsys, root, "LlamaForCausalLM", "model.layers.1.mlp.up_proj.weight")
    assert len(list((cache / "rows").glob("*.json"))) == 1  # the class built from config.json answered
    monkeypatch.setenv(build_rows.NO_BUILD_ENV, "1")
    found, findings = scanned(capsys, root)
    assert found == {"CG127"}, findings
    assert "config.json sets mlp_layer_types" in findings[0]["message"] and findings[0]["severity"] == "note"


def test_what_a_row_cannot_vouch_for() -> None:
    from guard.inventory.architectures import Loading, Mismatch, unvouched

    llama = rows.rows_for("llama")["LlamaForCausalLM"]  # type: ignore[index]  # the table has llama
    found = Loading("LlamaForCausalLM", ("model.layers.1.mlp.up_proj.weight",), (), (), (), ())
    assert unvouched(llama, {"num_hidden_layers": 2}, found) == ""
    # attention over a window or the whole sequence builds the same weights; linear attention does not
    assert unvouched(llama, {"layer_types": ["sliding_attention", "full_attention"]}, found) == ""
    assert "layer_types" in unvouched(llama, {"layer_types": ["linear_attention", "full_attention"]}, found)
    assert unvouched(llama, {"attention_layers": ["global", "local"]}, found) == ""  # GPT-Neo's
    assert "attn_layers" in unvouched(llama, {"attn_layers": ["local", "lsh"]}, found)  # Reformer's: other weights
    assert "attn_layer_period" in unvouched(llama, {"text_config": {"attn_layer_period": 2}}, found)
    hybrid = llama._replace(containers={k: v._replace(selector="layer_types", kinds={"mamba": v.kinds[""]})
                                        for k, v in llama.containers.items()})
    assert "'attention'" in unvouched(hybrid, {"layer_types": ["mamba", "attention"]}, found).replace('"', "'")
    assert unvouched(hybrid, {"layer_types": ["mamba", "mamba"]}, found) == ""
    assert "config.json has none" in unvouched(hybrid, {"layers_block_type": ["mamba"]}, found)
    fitted = Loading("X", (), (), (), (Mismatch("a", (16, 32), (256, 32), ("128*num_key_value_heads", "")),), ())
    assert "128*num_key_value_heads" in unvouched(llama, {}, fitted)
    assert unvouched(llama._replace(source="built"), {"attn_layer_period": 2}, found) == ""
