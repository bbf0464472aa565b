"""Quantized repositories on the Hub: `hub scan`, the upload gate and the reviewer, through the real
huggingface_hub client against the loopback stand-in, give the local scan's verdict, findings, logical
parameter count and ``quantization`` record, and read the weights' headers only (< 1 % of their bytes).

The checkpoints are written by the real libraries (bitsandbytes nf4, optimum-quanto) or to spec (GPTQ,
tests/quant_spec_writers.py) from a Llama big enough (~13 M parameters, ~20 MB a file) that a header
and one read-ahead block are well under 1 % of a weight file.
"""

from __future__ import annotations

import json
import posixpath
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("torch")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import quant_spec_writers as qs  # noqa: E402
import quant_writers as qw  # noqa: E402
from hub_standin import StandinHub, standin_fixture  # noqa: E402

from guard.cli import main  # noqa: E402
from guard.reporters.text import human_count  # noqa: E402

pytestmark = pytest.mark.slow

# big enough that a safetensors header plus the client's 64 KiB read-ahead is < 1 % of each weight file
HUB_SIZES = {"vocab_size": 8192, "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2}
WRITERS: dict[str, tuple[Callable[..., Path], str]] = {
    "bnb-nf4": (qw.write_bnb_4bit, "bitsandbytes"),
    "gptq": (qs.write_gptq, "gptq"),
    "quanto-int4": (qw.write_quanto, "quanto"),  # no quantization_config: quanto_qmap.json says it
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("quantized")
    with pytest.MonkeyPatch.context() as patch:
        for key, value in HUB_SIZES.items():
            patch.setitem(qw.SIZES, key, value)
        return {name: writer(root / name) for name, (writer, _) in WRITERS.items()}


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StandinHub]:
    yield from standin_fixture(monkeypatch, tmp_path)


def run_json(args: list[str], out: Path) -> tuple[int, dict[str, Any]]:
    rc = main([*args, "--format", "json", "-o", str(out)])
    return rc, json.loads(out.read_text())


def finding_keys(report: dict[str, Any], prefix: str) -> set[tuple[str, str, str | None]]:
    keys = set()
    for f in report["findings"]:
        assert f["path"].startswith(prefix), (f["path"], prefix)
        keys.add((f["code"], f["path"][len(prefix):].lstrip("/"), f.get("tensor")))
    return keys


def weight_sizes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.suffix in (".safetensors", ".bin"))


def weight_bytes_read(standin: StandinHub) -> int:
    return sum(r.bytes for r in standin.matching(method="GET", contains="/resolve/")
               if posixpath.basename(r.path).endswith((".safetensors", ".bin")))


def local_scan(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               policy: tuple[str, ...] = ()) -> tuple[int, dict[str, Any]]:
    monkeypatch.chdir(folder.parent)
    return run_json(["scan", folder.name, *policy], tmp_path / "local.json")


# the default policy (fp32 expected: the bf16/fp16 embeddings and lm_head are true CG101 errors, exit 1)
# and the expert's (--expect config: nothing to report but the norms' note, exit 0)
POLICIES: dict[str, tuple[tuple[str, ...], int]] = {"default": ((), 1), "expect-config": (("--expect", "config"), 0)}


def comparable(model: dict[str, Any]) -> dict[str, Any]:
    """What a remote scan must say as the local one does: sizes, the logical count, the quantization record."""
    keep = ("parameters", "bytes", "bits_per_weight", "quantization", "config_dtype", "dtypes")
    sets = [{k: ws.get(k) for k in ("name", "parameters", "bytes", "bits_per_weight", "parameters_by_label",
                                    "quantized")} for ws in model["sets"]]
    return {**{k: model.get(k) for k in keep}, "sets": sets}


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("name", sorted(WRITERS))
def test_hub_scan_equals_the_local_scan_header_only(name: str, policy: str, checkpoints: dict[str, Path],
                                                    standin: StandinHub, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    folder = checkpoints[name]
    options, verdict = POLICIES[policy]
    rc_local, local = local_scan(folder, tmp_path, monkeypatch, options)
    assert rc_local == verdict, local["findings"]
    [local_model] = local["models"]
    assert local_model["quantization"]["method"] == WRITERS[name][1]
    standin.add_repo(f"org/{name}", folder)
    rc_remote, remote = run_json(["hub", "scan", f"org/{name}", *options], tmp_path / "remote.json")
    assert rc_remote == rc_local
    assert finding_keys(remote, f"org/{name}") == finding_keys(local, folder.name)
    [remote_model] = remote["models"]
    assert comparable(remote_model) == comparable(local_model)
    weights = weight_sizes(folder)
    assert 0 < weight_bytes_read(standin) < 0.01 * weights, (weight_bytes_read(standin), weights)
    if name.startswith("quanto"):  # quanto_qmap.json is the only declaration: fetched from the repo
        assert any(r.path.endswith("/quanto_qmap.json") for r in standin.matching(method="GET", contains="/resolve/"))


def test_logical_count_is_the_unquantized_models(checkpoints: dict[str, Path], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.MonkeyPatch.context() as patch:
        for key, value in HUB_SIZES.items():
            patch.setitem(qw.SIZES, key, value)
        expected = qw.tiny_llama().num_parameters()
    for name, folder in checkpoints.items():
        _, local = local_scan(folder, tmp_path, monkeypatch)
        assert local["models"][0]["parameters"] == expected, name


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("name", ["bnb-nf4", "gptq"])
def test_upload_gate_gives_the_local_verdict_and_logical_size(name: str, policy: str, checkpoints: dict[str, Path],
                                                             standin: StandinHub, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    folder = checkpoints[name]
    options, verdict = POLICIES[policy]
    rc_local, local = local_scan(folder, tmp_path, monkeypatch, options)
    rc = main(["hub", "upload", str(folder), f"org/up-{name}", "--token", "hf_bot", "--create-pr", *options])
    assert rc == rc_local == verdict
    [pr] = standin.repos[f"org/up-{name}"].discussions
    codes = sorted({f["code"] for f in local["findings"]})
    summary = json.loads(pr.description.split("```json\n", 1)[1].split("\n```", 1)[0])
    assert summary["codes"] == codes and summary["failed"] == bool(rc_local)
    assert f"| {human_count(local['models'][0]['parameters'])} |" in pr.description
    # the pull request carries every file, whole
    uploaded = standin.files_at(f"org/up-{name}", "refs/pr/1")
    for path in folder.iterdir():
        if path.suffix == ".safetensors":
            assert uploaded[path.name] == path.read_bytes()


def test_reviewer_comments_the_local_verdict_header_only(checkpoints: dict[str, Path], standin: StandinHub,
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("starlette")
    from hub_delivery import make_reviewer

    from guard.hub.webhook import parse_payload

    folder = checkpoints["bnb-nf4"]
    rc_local, local = local_scan(folder, tmp_path, monkeypatch)
    sha = standin.add_repo("org/reviewed", folder)
    event = {
        "event": {"action": "update", "scope": "repo.content"},
        "repo": {"type": "model", "name": "org/reviewed", "id": "abc", "private": False,
                 "url": {"web": "https://hub/org/reviewed", "api": "https://hub/api/models/org/reviewed"},
                 "headSha": sha, "owner": {"id": "o1"}},
        "updatedRefs": [{"ref": "refs/heads/main", "oldSha": "0" * 40, "newSha": sha}],
        "webhook": {"id": "w1", "version": 3},
    }
    standin.reset_records()
    reviewer = make_reviewer(tmp_path / "queue.sqlite3")
    reviewer.start()
    try:
        for job in parse_payload(event)[0] or []:
            assert reviewer.submit(job)
        assert reviewer.wait_idle(60)
    finally:
        reviewer.close()
    [discussion] = standin.repos["org/reviewed"].discussions
    summary = json.loads(discussion.description.split("```json\n", 1)[1].split("\n```", 1)[0])
    assert summary["codes"] == sorted({f["code"] for f in local["findings"]})
    assert summary["failed"] == bool(rc_local)
    assert f"| {human_count(local['models'][0]['parameters'])} |" in discussion.description
    assert "nf4 (packed)" in discussion.description
    weights = weight_sizes(folder)
    assert 0 < weight_bytes_read(standin) < 0.01 * weights, (weight_bytes_read(standin), weights)
