"""Third-party progress bars never reach the user: transformers 5's "Loading weights: 0%|" bar, drawn by
``from_pretrained`` in the parity sides (in ckpt-guard's process, or a worker it starts), stays off while
``guard.quiet.quiet_libraries`` lasts, and stdout holds the report alone.

Each case is a fresh interpreter, as a command is: the libraries are imported inside the context, as the CLI
imports them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent

LOAD = """
import json
import sys
from guard.quiet import quiet_libraries
QUIET = {quiet!r}

def load():
    import transformers
    model = transformers.BertModel.from_pretrained(sys.argv[1])
    return sum(p.numel() for p in model.parameters())

if QUIET:  # a print inside the context goes nowhere (a library's): the answer is written after it, as the CLI's
    with quiet_libraries(verbose=False):
        count = load()
else:
    count = load()
print(json.dumps({{"parameters": count}}), flush=True)
"""


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import BertConfig, BertModel

    out = tmp_path_factory.mktemp("bert") / "bert"
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=32)).save_pretrained(out)
    return out


def _load(bert: Path, *, quiet: bool, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    environment = {k: v for k, v in os.environ.items() if not k.startswith(("TQDM_", "HF_HUB_DISABLE_PROGRESS"))}
    environment |= {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", **(env or {})}
    done = subprocess.run([sys.executable, "-c", LOAD.format(quiet=quiet), str(bert)], capture_output=True,
                          text=True, env=environment, timeout=300)
    assert done.returncode == 0, done.stderr
    return done


def test_transformers_draws_its_loading_bar_outside_the_context(bert: Path) -> None:
    """What the context is for: without it, the bar is on stderr (this test fails if transformers stops drawing
    it, and then the next one proves nothing)."""
    assert "Loading weights" in _load(bert, quiet=False).stderr


def test_no_progress_bar_inside_the_context_and_stdout_is_the_answer_alone(bert: Path) -> None:
    done = _load(bert, quiet=True)
    assert "Loading weights" not in done.stderr and "%|" not in done.stderr, done.stderr
    assert json.loads(done.stdout) == {"parameters": json.loads(done.stdout)["parameters"]}


def test_the_workers_it_starts_inherit_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker (the transformers-4 side, a JAX stack) is a child process: the environment carries the switch."""
    import os

    from guard.quiet import NO_BARS, quiet_libraries

    for name in NO_BARS:
        monkeypatch.delenv(name, raising=False)
    with quiet_libraries(verbose=False):
        child = subprocess.run([sys.executable, "-c", "import os, json; print(json.dumps(dict(os.environ)))"],
                               capture_output=True, text=True, check=True)
    assert {k: json.loads(child.stdout).get(k) for k in NO_BARS} == NO_BARS
    assert not set(NO_BARS) & set(os.environ)  # set back after


@pytest.mark.parametrize("verbose", [False, True])
def test_a_library_print_never_reaches_the_reports_stdout(bert: Path, tmp_path: Path, verbose: bool,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`--format json` on stdout is JSON alone although a library prints while the command runs (here: while
    convert carries the files beside the weights); with -v the print goes to stderr."""
    pytest.importorskip("flax")
    import guard.convert.run
    from guard.cli import main

    carry = guard.convert.run.carry_files

    def chatty(*args: object, **kwargs: object) -> list[str]:
        print("Loading weights: 100%|##########| a library's own line")
        return carry(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(guard.convert.run, "carry_files", chatty)
    out = tmp_path / "flax"
    args = ["convert", str(bert), "--to", "flax", "--out", str(out), "-f", "json", *(["-v"] if verbose else [])]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["extra"]["conversion"]["written"]
    assert ("a library's own line" in captured.err) is verbose
