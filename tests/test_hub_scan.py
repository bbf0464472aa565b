"""`ckpt-guard hub scan` with the real huggingface_hub client against the loopback stand-in."""

from __future__ import annotations

import json
import posixpath
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
np = pytest.importorskip("numpy")

from hub_standin import StandinHub, standin_fixture  # noqa: E402

from guard.cli import main  # noqa: E402

LFS_POINTER = (b"version https://git-lfs.github.com/spec/v1\n"
               b"oid sha256:" + b"ab" * 32 + b"\nsize 123456789\n")


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StandinHub]:
    yield from standin_fixture(monkeypatch, tmp_path)


def write_sharded_safetensors(directory: Path) -> None:
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    shards = {
        "model-00001-of-00002.safetensors": {"embed.weight": np.ones((8, 4), np.float32),
                                             "norm.weight": np.ones((4,), np.float32)},
        "model-00002-of-00002.safetensors": {"head.weight": np.ones((4, 8), np.float16),
                                             "position_ids": np.arange(8, dtype=np.int64)},
    }
    weight_map = {}
    for name, tensors in shards.items():
        save_file(tensors, directory / name)
        weight_map.update(dict.fromkeys(tensors, name))
    weight_map["missing.weight"] = "model-00002-of-00002.safetensors"  # CG004
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}, indent=2))
    (directory / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}, indent=2))


def write_torch_files(directory: Path) -> None:
    torch = pytest.importorskip("torch")
    directory.mkdir(parents=True, exist_ok=True)
    state = {"linear.weight": torch.ones(3, 2, dtype=torch.float16), "linear.bias": torch.ones(3)}
    torch.save(state, directory / "pytorch_model.bin")
    legacy = directory / "legacy"
    legacy.mkdir()
    torch.save({"w": torch.ones(2, 2, dtype=torch.float64)}, legacy / "pytorch_model.bin",
               _use_new_zipfile_serialization=False)


def write_flax_msgpack(directory: Path) -> None:
    serialization = pytest.importorskip("flax.serialization")
    directory.mkdir(parents=True, exist_ok=True)
    params = {"params": {"dense": {"kernel": np.ones((4, 3), np.float32), "bias": np.zeros((3,), np.float16)}}}
    (directory / "flax_model.msgpack").write_bytes(serialization.to_bytes(params))


def finding_keys(report: dict, prefix: str) -> set[tuple[str, str, str | None]]:
    """(code, path relative to the model root, tensor): comparable across local and remote."""
    keys = set()
    for f in report["findings"]:
        path = f["path"]
        assert path.startswith(prefix), (path, prefix)
        keys.add((f["code"], path[len(prefix):].lstrip("/"), f.get("tensor")))
    return keys


def run_json(args: list[str], out: Path) -> tuple[int, dict]:
    rc = main([*args, "--format", "json", "-o", str(out)])
    return rc, json.loads(out.read_text()) if out.exists() else {}


def local_and_remote(standin: StandinHub, folder: Path, repo: str,
                     monkeypatch: pytest.MonkeyPatch) -> tuple[int, dict, int, dict]:
    """``scan FOLDER`` (run beside it) and ``hub scan REPO`` of the same files uploaded to the stand-in:
    (rc_local, local report, rc_remote, remote report), comparable through ``finding_keys``."""
    standin.add_repo(repo, folder)
    monkeypatch.chdir(folder.parent)
    rc_local, local = run_json(["scan", folder.name], folder.parent / "local.json")
    rc_remote, remote = run_json(["hub", "scan", repo], folder.parent / "remote.json")
    return rc_local, local, rc_remote, remote


@pytest.mark.parametrize("builder", [write_sharded_safetensors, write_torch_files, write_flax_msgpack],
                         ids=["sharded-safetensors", "torch-zip-and-legacy", "flax-msgpack"])
def test_remote_scan_gives_the_local_findings(standin: StandinHub, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch, builder) -> None:
    model = tmp_path / "model"
    builder(model)
    rc_local, local, rc_remote, remote = local_and_remote(standin, model, "org/model", monkeypatch)
    assert rc_remote == rc_local
    assert finding_keys(remote, "org/model") == finding_keys(local, "model")
    assert [m["dtypes"] for m in remote["models"]] == [m["dtypes"] for m in local["models"]]
    # Weight files were read through ranges, never whole.
    weights = [r for r in standin.matching(method="GET", contains="/resolve/")
               if posixpath.basename(r.path).endswith((".safetensors", ".bin", ".msgpack"))]
    assert weights and all(r.range is not None for r in weights)


def test_sharded_safetensors_findings(standin: StandinHub, tmp_path: Path) -> None:
    write_sharded_safetensors(tmp_path / "m")
    standin.add_repo("org/sharded", tmp_path / "m")
    rc, report = run_json(["hub", "scan", "org/sharded"], tmp_path / "r.json")
    assert rc == 1
    codes = {f["code"] for f in report["findings"]}
    assert {"CG004", "CG101", "CG102", "CG103"} <= codes
    hub = report["extra"]["hub"]["repos"][0]
    assert hub["sha"] == standin.repos["org/sharded"].refs["main"]
    # One request per shard; index and config fetched whole; one model_info.
    per_file = {f["path"]: f["requests"] for f in hub["files"]}
    assert per_file["model-00001-of-00002.safetensors"] == 1
    assert per_file["config.json"] == 1
    assert len(standin.matching(contains="/api/models/org/sharded")) == 1


def test_large_file_costs_one_request_and_under_one_percent(standin: StandinHub, tmp_path: Path) -> None:
    from safetensors.numpy import save

    big = save({"w": np.zeros((2_500_000,), np.float32)})  # 10 MB
    many = save({f"layer.{i}.weight": np.zeros((1,), np.float32) for i in range(2000)})  # 150 KB header
    standin.add_repo("org/big", {"model.safetensors": big, "many/model.safetensors": many})
    rc, report = run_json(["hub", "scan", "org/big"], tmp_path / "r.json")
    assert rc == 0, report["findings"]
    stats = {f["path"]: f for f in report["extra"]["hub"]["repos"][0]["files"]}
    assert stats["model.safetensors"]["requests"] == 1
    assert stats["model.safetensors"]["bytes"] < len(big) / 100
    assert stats["many/model.safetensors"]["requests"] == 2  # a large header: one more read
    header_len = struct.unpack("<Q", many[:8])[0]
    assert stats["many/model.safetensors"]["bytes"] <= 8 + header_len + 64 * 1024


def test_header_running_past_the_file_is_cg001(standin: StandinHub, tmp_path: Path) -> None:
    standin.add_repo("org/bad", {"model.safetensors": struct.pack("<Q", 10**6) + b'{"a": 1}'})
    rc, report = run_json(["hub", "scan", "org/bad"], tmp_path / "r.json")
    assert rc == 1
    [finding] = report["findings"]
    assert finding["code"] == "CG001" and "runs past the end" in finding["message"]


def test_lfs_pointer_only_file_is_cg002(standin: StandinHub, tmp_path: Path) -> None:
    standin.add_repo("org/pointer", {"model.safetensors": LFS_POINTER})
    rc, report = run_json(["hub", "scan", "org/pointer"], tmp_path / "r.json")
    assert rc == 1
    assert [f["code"] for f in report["findings"]] == ["CG002"]


def test_private_repo_needs_a_token(standin: StandinHub, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    write_sharded_safetensors(tmp_path / "m")
    standin.add_repo("org/private", tmp_path / "m", private=True)
    assert main(["hub", "scan", "org/private"]) == 2
    err = capsys.readouterr().err
    assert "org/private not found" in err and "token" in err and "Traceback" not in err
    assert main(["hub", "scan", "org/private", "--token", "hf_reader", "-o", str(tmp_path / "r.txt")]) == 1
    monkeypatch.setenv("HF_TOKEN", "hf_reader")
    assert main(["hub", "scan", "org/private", "-o", str(tmp_path / "r2.txt")]) == 1
    assert "hf_reader" not in capsys.readouterr().err + (tmp_path / "r.txt").read_text()


def test_gated_repo_without_token(standin: StandinHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    standin.add_repo("org/gated", {"model.safetensors": LFS_POINTER}, gated=True)
    assert main(["hub", "scan", "org/gated"]) == 2
    assert "gated" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["org/missing"], "repository org/missing not found"),
    (["org/there", "--revision", "no-such-branch"], "revision 'no-such-branch' not found in org/there"),
])
def test_missing_repo_or_revision_is_exit_2(standin: StandinHub, capsys: pytest.CaptureFixture[str],
                                            args: list[str], message: str) -> None:
    standin.add_repo("org/there", {"model.safetensors": LFS_POINTER})
    assert main(["hub", "scan", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_revision_and_pr_ref(standin: StandinHub, tmp_path: Path) -> None:
    from safetensors.numpy import save

    standin.add_repo("org/m", {"model.safetensors": save({"w": np.zeros((2,), np.float32)})})
    num, sha = standin.add_pull_request("org/m", {"model.safetensors": save({"w": np.zeros((2,), np.float16)})})
    assert main(["hub", "scan", "org/m", "-o", str(tmp_path / "a")]) == 0
    assert main(["hub", "scan", "org/m", "--revision", f"refs/pr/{num}", "-o", str(tmp_path / "b")]) == 1
    assert main(["hub", "scan", "org/m", "--revision", sha, "-o", str(tmp_path / "c")]) == 1


def test_500s_are_retried_then_exit_2(standin: StandinHub, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    standin.add_repo("org/flaky", {"model.safetensors": LFS_POINTER})
    standin.fail("GET", "/api/models/org/flaky", 500, times=2)
    assert main(["hub", "scan", "org/flaky", "-o", str(tmp_path / "r")]) == 1  # third attempt works
    standin.reset_records()
    standin.fail("GET", "/resolve/", 503, times=100)
    assert main(["hub", "scan", "org/flaky"]) == 2
    assert "HTTP 503" in capsys.readouterr().err
    from guard.hub.client import ATTEMPTS

    assert len(standin.matching(method="GET", contains="/resolve/")) == ATTEMPTS  # bounded


def test_a_stalled_server_times_out(standin: StandinHub, capsys: pytest.CaptureFixture[str]) -> None:
    standin.add_repo("org/slow", {"model.safetensors": LFS_POINTER})
    standin.fail("GET", "/resolve/", None, times=100)
    assert main(["hub", "scan", "org/slow", "--timeout", "0.2"]) == 2
    err = capsys.readouterr().err
    assert "timed out" in err and "Traceback" not in err


def test_author_audit_scans_every_model(standin: StandinHub, tmp_path: Path) -> None:
    from safetensors.numpy import save

    for i in range(5):
        dtype = np.float16 if i == 3 else np.float32
        standin.add_repo(f"acme/m{i}", {"model.safetensors": save({"w": np.zeros((2,), dtype)})})
    standin.add_repo("other/x", {"model.safetensors": LFS_POINTER})
    rc, report = run_json(["hub", "scan", "--author", "acme", "--jobs", "3"], tmp_path / "r.json")
    assert rc == 1
    assert sorted(r["repo"] for r in report["extra"]["hub"]["repos"]) == [f"acme/m{i}" for i in range(5)]
    assert {f["path"] for f in report["findings"]} == {"acme/m3/model.safetensors"}


def test_one_unreadable_repo_among_several(standin: StandinHub, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    standin.add_repo("org/ok", {"model.safetensors": LFS_POINTER})
    rc = main(["hub", "scan", "org/ok", "org/nope", "-o", str(tmp_path / "r.txt")])
    assert rc == 2
    assert "org/ok" in (tmp_path / "r.txt").read_text()
    assert "org/nope not found" in capsys.readouterr().err


def test_usage_errors(standin: StandinHub) -> None:
    assert main(["hub", "scan"]) == 2


def test_budget_exhaustion_is_cg401_not_cg001(standin: StandinHub, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import guard.hub.remote

    serialization = pytest.importorskip("flax.serialization")
    params = {f"layer{i}": np.zeros((40_000,), np.float32) for i in range(6)}  # 160 KB payloads
    standin.add_repo("org/flax", {"flax_model.msgpack": serialization.to_bytes(params)})
    monkeypatch.setattr(guard.hub.remote, "MAX_REQUESTS", 2)
    rc, report = run_json(["hub", "scan", "org/flax"], tmp_path / "r.json")
    assert rc == 0  # a note does not fail the run
    [finding] = report["findings"]
    assert finding["code"] == "CG401" and finding["severity"] == "note"
    assert report["extra"]["hub"]["repos"][0]["files"][0]["requests"] == 2


def test_hub_file_cache_merges_and_counts(standin: StandinHub) -> None:
    from guard.hub.client import HubClient
    from guard.hub.remote import HubFile

    data = bytes(range(256)) * 1024  # 256 KiB
    standin.add_repo("org/blob", {"blob.bin": data})
    source = HubFile(HubClient(), repo_id="org/blob", revision="main", filename="blob.bin", size=len(data),
                     name="blob", readahead=1000)
    assert source.read_at(0, 8) == data[:8] and source.requests == 1 and source.bytes_read == 1000
    assert source.read_at(500, 400) == data[500:900] and source.requests == 1  # cached
    assert source.read_at(900, 300) == data[900:1200] and source.requests == 2  # only the missing part
    assert source.bytes_read == 2000
    assert source.read_at(len(data) - 22, 22) == data[-22:]  # the tail: one block back from the end
    assert source.read_at(len(data) - 1000, 900) == data[-1000:-100] and source.requests == 3
    assert source.read_at(0, 0) == b""
    with pytest.raises(Exception, match="past the end"):
        source.read_at(len(data) - 4, 8)
