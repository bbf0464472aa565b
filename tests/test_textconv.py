"""`ckpt-guard textconv FILE`: the git diff driver, through real `git diff`, `git log -p` and `git show`."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from guard.cli import main  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def textconv(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, list[str]]:
    capsys.readouterr()
    rc = main(["textconv", str(path)])
    return rc, capsys.readouterr().out.splitlines()


def driver() -> str:
    """The command a user configures: the installed console script, else this interpreter's module."""
    script = Path(sys.executable).with_name("ckpt-guard")
    return shlex.quote(str(script)) if script.exists() else f"{shlex.quote(sys.executable)} -m guard"


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(repo.parent), "GIT_PAGER": "cat",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True).stdout


def changed_lines(patch: str) -> list[str]:
    return [line for line in patch.splitlines()
            if line[:1] in ("+", "-") and not line.startswith(("+++", "---"))]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    # the README's two lines
    (repo / ".gitattributes").write_text("*.safetensors diff=ckpt\n*.bin diff=ckpt\n")
    git(repo, "config", "diff.ckpt.textconv", f"{driver()} textconv")
    return repo


def weights() -> dict[str, object]:
    torch.manual_seed(0)
    return {"embed.weight": torch.randn(10, 4), "layers.0.weight": torch.randn(4, 4),
            "layers.0.bias": torch.randn(4), "layers.1.weight": torch.randn(4, 4), "head.weight": torch.randn(3, 4)}


def test_git_diff_shows_only_the_tensors_that_changed(repo: Path) -> None:
    state = weights()
    safetensors_torch.save_file(state, str(repo / "model.safetensors"))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "fp32")
    state["layers.0.weight"] = state["layers.0.weight"].to(torch.bfloat16)  # recast
    state["embed.weight"] = torch.randn(12, 4)  # resized
    del state["layers.0.bias"]  # dropped
    state["layers.1.weight"] = state["layers.1.weight"] * 2  # values only: not a header change
    safetensors_torch.save_file(state, str(repo / "model.safetensors"))
    expected = ["-embed.weight F32 [10, 4]", "+embed.weight F32 [12, 4]", "-layers.0.bias F32 [4]",
                "-layers.0.weight F32 [4, 4]", "+layers.0.weight BF16 [4, 4]"]
    assert changed_lines(git(repo, "diff")) == expected
    git(repo, "commit", "-qam", "edit")
    assert changed_lines(git(repo, "show", "HEAD")) == expected
    log = git(repo, "log", "-p", "--format=%s", "--", "model.safetensors")
    assert changed_lines(log) == expected + ["+# ckpt-guard textconv: safetensors", *(
        f"+{line}" for line in ["embed.weight F32 [10, 4]", "head.weight F32 [3, 4]", "layers.0.bias F32 [4]",
                                "layers.0.weight F32 [4, 4]", "layers.1.weight F32 [4, 4]"])]


def test_a_resave_that_only_moved_bytes_shows_no_lines(repo: Path) -> None:
    state = weights()
    safetensors_torch.save_file(state, str(repo / "model.safetensors"))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    safetensors_torch.save_file(dict(reversed(list(state.items()))), str(repo / "model.safetensors"),
                                metadata={"format": "pt"})
    assert git(repo, "status", "--porcelain").strip() == "M model.safetensors"
    assert changed_lines(git(repo, "diff")) == []


def test_a_pickle_checkpoint_diffs_through_the_same_driver(repo: Path) -> None:
    state = weights()
    torch.save(state, repo / "pytorch_model.bin")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    state["head.weight"] = torch.randn(5, 4).half()
    torch.save(state, repo / "pytorch_model.bin")
    assert changed_lines(git(repo, "diff")) == ["-head.weight F32 [3, 4]", "+head.weight F16 [5, 4]"]


def test_an_lfs_pointer_that_was_not_smudged_is_one_clear_line(tmp_path: Path, capsys) -> None:
    oid = "4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393"
    pointer = tmp_path / "model.safetensors"
    pointer.write_text(f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize 12345\n")
    rc, lines = textconv(capsys, pointer)
    assert rc == 0 and lines == [f"# ckpt-guard: Git LFS pointer, not smudged (oid sha256:{oid}, 12,345 bytes): "
                                 "run `git lfs pull` (or install git-lfs) to see its tensors"]


def test_an_unreadable_file_is_one_line_and_a_missing_one_a_usage_error(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"\xff" * 64)
    rc, lines = textconv(capsys, bad)
    assert rc == 0 and len(lines) == 1 and lines[0].startswith("# ckpt-guard: unreadable: ")
    capsys.readouterr()
    assert main(["textconv", str(tmp_path / "nope.safetensors")]) == 2
    assert "nope.safetensors: no such file" in capsys.readouterr().err


def test_a_name_cannot_forge_a_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file({"a\n+evil.weight F32 [1]": torch.ones(1), "\x1b[2Jb": torch.ones(1)}, str(path))
    rc, lines = textconv(capsys, path)
    assert lines == ["# ckpt-guard textconv: safetensors", "\\x1b[2Jb F32 [1]", "a\\n+evil.weight F32 [1] F32 [1]"]


def _npy(path: Path) -> None:
    import numpy as np

    np.save(path, np.zeros((2, 3), dtype=np.float16))


def _npz(path: Path) -> None:
    import numpy as np

    np.savez(path, w=np.zeros((2, 3), dtype=np.float32), b=np.zeros(3, dtype=np.float32))


def _flax(path: Path) -> None:
    import numpy as np
    from flax import serialization

    path.write_bytes(serialization.msgpack_serialize({"params": {"dense": {"kernel": np.zeros((2, 3), np.float32)}}}))


def _gguf(path: Path) -> None:
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _onnx(path: Path) -> None:
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    weight = numpy_helper.from_array(np.zeros((3, 2), dtype=np.float32), "fc.weight")
    node = helper.make_node("MatMul", ["x", "fc.weight"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2])], [weight])
    onnx.save(helper.make_model(graph), str(path))


def _torch(path: Path) -> None:
    torch.save({"w": torch.zeros(2, 3, dtype=torch.bfloat16)}, path)


def _h5(path: Path) -> None:
    import h5py
    import numpy as np

    with h5py.File(path, "w") as fh:
        fh.create_dataset("dense/kernel", data=np.zeros((2, 3), dtype=np.float32))


@pytest.mark.parametrize("name, write, line", [
    ("w.npy", _npy, "F16 [2, 3]"),
    ("w.npz", _npz, "w F32 [2, 3]"),
    ("flax_model.msgpack", _flax, "F32 [2, 3]"),
    ("model.gguf", _gguf, "token_embd.weight F16 ["),
    ("model.onnx", _onnx, "fc.weight F32 [3, 2]"),
    ("model.pt", _torch, "w BF16 [2, 3]"),
    ("model.h5", _h5, "F32 [2, 3]"),
])
def test_every_format_the_scanner_reads_prints_its_tensors(tmp_path: Path, capsys, name: str, write, line: str) -> None:
    path = tmp_path / name
    write(path)
    rc, lines = textconv(capsys, path)
    assert rc == 0 and lines[0].startswith("# ckpt-guard textconv: "), lines
    assert any(line in row for row in lines[1:]), lines
