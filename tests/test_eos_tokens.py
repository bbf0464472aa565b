"""CG128: generation_config.json's eos_token_id against the tokenizer's special tokens and the chat template.

Each model is a tiny Qwen2 saved by transformers (save_pretrained), its tokenizer built by the tokenizers library
and saved by transformers' tokenizer (tokenizer.json, tokenizer_config.json, chat_template.jinja), its generation
config by GenerationConfig.save_pretrained; each damaged case beside its healthy twin, which gives no finding.
The incident: NousResearch/Hermes-4-14B's generation config named the pad token, not the template's end of turn
(../shared/reference/published-defects-2025-26.md).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from guard.cli import main
from guard.inventory.tokens import added_tokens

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

ENDOFTEXT, IM_START, IM_END = 8, 9, 10  # the ids the tokenizer below gives its special tokens
QWEN_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _tokenizer(folder: Path, *, eos: str, pad: str, template: str | None, extra: int = 0) -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["hello", "world", "a", "b", "c", "d", "e", "f"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    if extra:
        tok.add_special_tokens([AddedToken(f"<|reserved_special_token_{i}|>", special=True) for i in range(extra)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=pad,
                                   **({"chat_template": template} if template else {}))
    fast.save_pretrained(folder)


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 saved by transformers: config.json (vocab 16, eos_token_id <|im_end|>) and model.safetensors."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                         bos_token_id=ENDOFTEXT, eos_token_id=IM_END, pad_token_id=ENDOFTEXT)
    folder = tmp_path_factory.mktemp("qwen2")
    Qwen2ForCausalLM(config).save_pretrained(folder)
    (folder / "generation_config.json").unlink(missing_ok=True)  # each case writes its own
    return folder


def _model(weights: Path, folder: Path, *, eos_ids: Any, config_eos: int | None = None, eos: str = "<|im_end|>",
           pad: str = "<|endoftext|>", template: str | None = QWEN_TEMPLATE, extra: int = 0) -> Path:
    from transformers import GenerationConfig

    shutil.copytree(weights, folder)
    if config_eos is not None:
        config = json.loads((folder / "config.json").read_text())
        config["eos_token_id"] = config_eos
        (folder / "config.json").write_text(json.dumps(config, indent=2))
    _tokenizer(folder, eos=eos, pad=pad, template=template, extra=extra)
    GenerationConfig(bos_token_id=ENDOFTEXT, eos_token_id=eos_ids, pad_token_id=ENDOFTEXT).save_pretrained(folder)
    return folder


def _findings(folder: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    capsys.readouterr()
    main(["scan", "--format", "json", "--no-summary", str(folder)])
    report = json.loads(capsys.readouterr().out)
    findings: list[dict[str, Any]] = report["findings"]
    return findings


def test_the_healthy_chat_model_gives_no_finding(weights: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    folder = _model(weights, tmp_path / "m", eos_ids=[IM_END, ENDOFTEXT])
    assert (folder / "chat_template.jinja").is_file() and (folder / "tokenizer.json").is_file()
    assert _findings(folder, capsys) == []


def test_hermes_4_the_pad_token_alone_and_no_end_of_turn(weights: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    folder = _model(weights, tmp_path / "m", eos_ids=ENDOFTEXT, config_eos=ENDOFTEXT)
    [finding] = _findings(folder, capsys)
    assert (finding["code"], finding["severity"]) == ("CG128", "warning")
    assert finding["path"].endswith("m/generation_config.json")
    message = finding["message"]
    assert message.startswith("eos_token_id 8 ('<|endoftext|>') is the tokenizer's pad token 8 ('<|endoftext|>') "
                              "alone; it lacks the chat template's end-of-turn token 10 ('<|im_end|>')"), message


def test_neither_the_tokenizers_eos_nor_config_json_s(weights: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    folder = _model(weights, tmp_path / "m", eos_ids=IM_START)
    [finding] = _findings(folder, capsys)
    assert finding["code"] == "CG128" and finding["severity"] == "warning"
    assert ("includes neither the tokenizer's eos_token 10 ('<|im_end|>') nor config.json's eos_token_id "
            "10 ('<|im_end|>')") in finding["message"], finding["message"]


def test_an_id_outside_the_vocabulary_is_an_error(weights: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    folder = _model(weights, tmp_path / "m", eos_ids=[IM_END, 99])
    [finding] = _findings(folder, capsys)
    assert (finding["code"], finding["severity"]) == ("CG128", "error")
    assert finding["message"].startswith("eos_token_id 99 is outside the vocabulary (config.json's vocab_size 16)")
    assert main(["scan", "--no-summary", str(folder)]) == 1


@pytest.mark.parametrize("template", [QWEN_TEMPLATE, None], ids=["with-template", "no-template"])
def test_a_base_model_whose_eos_is_endoftext_is_fine(weights: Path, tmp_path: Path, template: str | None,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Qwen2.5's base models: eos and pad <|endoftext|> in the tokenizer and both configs, the instruct sibling's
    chat template shipped beside them."""
    folder = _model(weights, tmp_path / "m", eos_ids=ENDOFTEXT, config_eos=ENDOFTEXT, eos="<|endoftext|>",
                    template=template)
    assert _findings(folder, capsys) == []


def test_the_template_in_tokenizer_config_and_its_added_tokens_decoder(weights: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """transformers 4's layout: the template inside tokenizer_config.json with ``added_tokens_decoder`` (id ->
    token) and no chat_template.jinja; here without tokenizer.json, so the ids come from the config alone."""
    folder = _model(weights, tmp_path / "m", eos_ids=ENDOFTEXT, config_eos=ENDOFTEXT)
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for i, t in ((8, "<|endoftext|>"), (9, "<|im_start|>"), (10, "<|im_end|>"))}
    tokenizer_config.update(added_tokens_decoder=added, chat_template=(folder / "chat_template.jinja").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (folder / "chat_template.jinja").unlink()
    (folder / "tokenizer.json").unlink()
    [finding] = _findings(folder, capsys)
    assert finding["code"] == "CG128" and "end-of-turn token 10 ('<|im_end|>')" in finding["message"]


def test_added_tokens_past_the_first_mebibyte_are_read(weights: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """9,000 reserved special tokens (Llama 3 has 256): the added tokens run past the first read of the head."""
    folder = _model(weights, tmp_path / "m", eos_ids=ENDOFTEXT, config_eos=ENDOFTEXT, extra=9000)
    data = (folder / "tokenizer.json").read_bytes()
    assert data.index(b'"normalizer"') > 1 << 20
    tokens = added_tokens(data)
    assert tokens is not None and len(tokens) == 9003 and tokens[2] == (IM_END, "<|im_end|>", True)
    [finding] = _findings(folder, capsys)
    assert "end-of-turn token 10 ('<|im_end|>')" in finding["message"]


def test_the_scan_imports_no_tokenizer_library(weights: Path, tmp_path: Path) -> None:
    folder = _model(weights, tmp_path / "m", eos_ids=ENDOFTEXT, config_eos=ENDOFTEXT)
    code = ("import sys\nfrom guard.cli import main\nrc = main(['scan', '--no-summary', sys.argv[1]])\n"
            "print('MODULES', rc, sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tokenizers', 'transformers', 'jinja2', 'sentencepiece', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, check=True)
    assert "CG128" in out.stdout
    assert out.stdout.rstrip().endswith("MODULES 0 []"), out.stdout  # a warning: exit 0 at --fail-on error


def test_without_a_generation_config_the_tokenizer_json_is_not_read(weights: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A model folder with a tokenizer and no generation config (an encoder's): CG128 has nothing to compare,
    so tokenizer.json's head is not read; tokenizer_config.json is still parsed (CG001 where it is broken)."""
    from guard.inventory.discovery import discover_models, load_local_model

    folder = _model(weights, tmp_path / "m", eos_ids=ENDOFTEXT)
    (folder / "generation_config.json").unlink()
    [model] = discover_models([folder])
    inventory = load_local_model(model)
    assert set(inventory.token_files) == {"tokenizer_config.json"}
    assert _findings(folder, capsys) == []
    (folder / "tokenizer_config.json").write_text('{"eos_token": "<|im_end|>",}')
    [finding] = _findings(folder, capsys)
    assert finding["code"] == "CG001" and finding["path"].endswith("m/tokenizer_config.json")


@pytest.mark.parametrize("keep_tokenizer_json", [True, False], ids=["tokenizer-json-head", "config-decoder-only"])
def test_the_hub_scan_finds_what_the_local_scan_finds(weights: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       keep_tokenizer_json: bool) -> None:
    """`hub scan` reads the generation config and tokenizer_config.json whole and tokenizer.json's head (one
    ranged read): the same CG128 as the local scan of the same files."""
    pytest.importorskip("huggingface_hub")
    from hub_standin import standin_fixture

    folder = _model(weights, tmp_path / "m", eos_ids=ENDOFTEXT, config_eos=ENDOFTEXT)
    if not keep_tokenizer_json:  # transformers 4's tokenizer_config.json names the ids itself
        tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
        tokenizer_config["added_tokens_decoder"] = {
            str(i): {"content": t, "special": True} for i, t in ((8, "<|endoftext|>"), (10, "<|im_end|>"))}
        (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
        (folder / "tokenizer.json").unlink()
    for hub in standin_fixture(monkeypatch, tmp_path):
        hub.add_repo("org/hermes", folder)
        out = tmp_path / "remote.json"
        assert main(["hub", "scan", "org/hermes", "--format", "json", "-o", str(out)]) == 0
        remote = json.loads(out.read_text())
        [finding] = remote["findings"]
        assert finding["code"] == "CG128" and finding["path"] == "org/hermes/generation_config.json"
        assert "end-of-turn token 10 ('<|im_end|>')" in finding["message"]
        assert main(["scan", "--format", "json", "-o", str(tmp_path / "local.json"), str(folder)]) == 0
        [local] = json.loads((tmp_path / "local.json").read_text())["findings"]
        assert (local["code"], local["message"]) == (finding["code"], finding["message"])
        files = {f["path"]: f for f in remote["extra"]["hub"]["repos"][0]["files"]}
        if keep_tokenizer_json:
            assert files["tokenizer.json"]["requests"] == 1
            assert files["tokenizer.json"]["bytes"] <= 1 << 20


def test_hostile_token_files_give_a_bounded_finding_never_a_traceback(weights: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Hand-made: 10,000 EOS ids, an added_tokens_decoder keyed by non-ASCII digits and holding non-objects, a
    chat_template of the wrong type, a tokenizer.json whose added_tokens is no list."""
    folder = _model(weights, tmp_path / "m", eos_ids=ENDOFTEXT)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": list(range(100, 10_100))}))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": {"content": 5}, "pad_token": ["x"], "chat_template": 7,
        "added_tokens_decoder": {"\u00b2": {"content": "<a>"}, "\u0661": {"content": "<b>"}, "-1": {}, "3": "x"}}))
    (folder / "tokenizer.json").write_text('{"version": "1.0", "added_tokens": {"id": 1}, "model": {}}')
    error, warning = _findings(folder, capsys)  # outside the vocabulary; and config.json's EOS (10) not among them
    assert [(f["code"], f["severity"]) for f in (error, warning)] == [("CG128", "error"), ("CG128", "warning")]
    assert all(len(f["message"]) < 400 and "…(+9,992)" in f["message"] for f in (error, warning)), (error, warning)
