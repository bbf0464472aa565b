"""`ckpt-guard hub diff REPO --from REV --to REV`: two revisions compared from their remote headers.

Through the real huggingface_hub client against the loopback stand-in; every byte the stand-in sent
is counted, so "header-only" is a measured figure, not a promise.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
np = pytest.importorskip("numpy")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from hub_standin import StandinHub, standin_fixture  # noqa: E402

from guard.cli import main  # noqa: E402

REPO = "org/llm"


def weights(*, w: object = np.float32, bias: bool = True, vocab: int = 2048) -> bytes:
    """16 MiB and more, written by safetensors: a 64 KiB header read is well under 1 % of it."""
    tensors = {"embed.weight": np.zeros((vocab, 1024), np.float32), "w": np.zeros((1024, 1024), w)}
    if bias:
        tensors["b"] = np.zeros((1024,), np.float32)
    return safetensors_numpy.save(tensors)


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StandinHub]:
    yield from standin_fixture(monkeypatch, tmp_path)


@pytest.fixture
def history(standin: StandinHub) -> dict[str, str]:
    config = b'{"model_type": "llama", "torch_dtype": "float32"}'
    revs = {"v1": standin.add_repo(REPO, {"model.safetensors": weights(), "config.json": config})}
    revs["readme"] = standin.add_commit(REPO, {"README.md": b"# llm\n"}, replace=False)
    revs["bf16"] = standin.add_commit(REPO, {"model.safetensors": weights(w=np.float16)}, replace=False)
    revs["resized"] = standin.add_commit(REPO, {"model.safetensors": weights(bias=False, vocab=2056)},
                                         replace=False)
    return revs


def weight_bytes_sent(standin: StandinHub) -> int:
    return sum(r.bytes for r in standin.records if r.method == "GET" and r.path.endswith(".safetensors"))


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["hub", "diff", REPO, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_recast_is_introduced_findings_and_exit_1_reading_only_headers(
        standin: StandinHub, history: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    standin.reset_records()
    code, out, _ = run(capsys, "--from", history["readme"], "--to", history["bf16"], "--format", "json")
    assert code == 1
    report = json.loads(out)
    assert report["kind"] == "ckpt-guard-diff"
    [model] = report["models"]
    [ws] = model["sets"]
    assert [(c["name"], c["old"]["dtype"], c["new"]["dtype"]) for c in ws["changed"]] == [("w", "F32", "F16")]
    assert {f["code"] for f in report["introduced"]} >= {"CG101"} and report["resolved"] == []
    sizes = len(weights()) + len(weights(w=np.float16))
    sent = weight_bytes_sent(standin)
    assert 0 < sent < 0.01 * sizes, (sent, sizes)  # header-only
    hub = report["extra"]["hub"]
    assert hub["old"]["sha"] == history["readme"] and hub["new"]["sha"] == history["bf16"]
    assert sum(f["bytes"] for side in ("old", "new") for f in hub[side]["files"]
               if f["path"].endswith(".safetensors")) == sent


def test_resize_and_dropped_bias_with_branch_names(standin: StandinHub, history: dict[str, str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--from", history["v1"], "--to", "main", "--format", "json")
    report = json.loads(out)
    [ws] = report["models"][0]["sets"]
    assert [t["name"] for t in ws["removed"]] == ["b"]
    reshaped = {c["name"]: (c["old"]["shape"], c["new"]["shape"]) for c in ws["changed"]}
    assert reshaped == {"embed.weight": ([2048, 1024], [2056, 1024])}
    assert code == 0  # nothing introduced
    code, out, _ = run(capsys, "--from", history["v1"], "--to", "main", "--format", "markdown")
    assert code == 0 and "| model | weight set |" in out and "reshaped" in out


def test_no_weight_change_is_exit_0(standin: StandinHub, history: dict[str, str],
                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--from", history["v1"], "--to", history["readme"])
    assert code == 0, out


@pytest.mark.parametrize("flag", ["--from", "--to"])
def test_a_revision_that_does_not_exist_is_exit_2_in_one_line(standin: StandinHub, history: dict[str, str],
                                                              capsys: pytest.CaptureFixture[str], flag: str) -> None:
    other = "--to" if flag == "--from" else "--from"
    code, out, err = run(capsys, flag, "no-such-branch", other, history["v1"])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "no-such-branch" in err and "Traceback" not in err


def test_a_repository_that_does_not_exist_is_exit_2(standin: StandinHub, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["hub", "diff", "org/nope", "--from", "main"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_hostile_tensor_names_stay_escaped(standin: StandinHub, capsys: pytest.CaptureFixture[str]) -> None:
    hostile = "w\n::error file=x::pwned|<img src=x>"
    old = standin.add_repo("org/evil", {"model.safetensors": safetensors_numpy.save({"a": np.zeros(4, np.float32)})})
    new = standin.add_commit("org/evil", {"model.safetensors": safetensors_numpy.save(
        {"a": np.zeros(4, np.float32), hostile: np.zeros(4, np.float32)})})
    for fmt in ("github", "markdown", "text"):
        capsys.readouterr()
        main(["hub", "diff", "org/evil", "--from", old, "--to", new, "--format", fmt])
        out = capsys.readouterr().out
        assert not any(line.lstrip().startswith("::error file=x") for line in out.splitlines()), out
        assert fmt == "text" or "<img" not in out


def test_the_formats_are_the_local_diffs() -> None:
    from guard.cli.hub import DIFF_FORMATS
    from guard.diff.render import VIEWS

    assert DIFF_FORMATS == tuple(VIEWS)
