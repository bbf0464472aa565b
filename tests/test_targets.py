"""The one table of targets: every choice, side, step, version and doc table comes from it.

Adding a target is adding a row to guard/targets/table.py and a side in guard/worker/, nothing else:
these tests fail when a target is known anywhere else (a list of names, a version written twice, a choice
or a doc table written by hand) or when a row names what does not exist.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path
from typing import Any

import click
import pytest

from guard.envs.registry import ENVIRONMENTS
from guard.lazy import resolve
from guard.targets import TARGETS, against_choices, to_choices
from guard.targets.doc import markdown_table
from guard.worker.side import Side

ROOT = Path(__file__).resolve().parents[1]
GUARD = ROOT / "guard"
# the modules allowed to spell out target names together: the table, its data, the environments' registry
TABLE_MODULES = {GUARD / "targets" / "table.py", GUARD / "envs" / "registry.py"}


def _option(command: click.Command, name: str) -> click.Option:
    return next(p for p in command.params if isinstance(p, click.Option) and p.name == name)


def test_the_cli_choices_are_the_table_rows() -> None:
    from guard.cli.convert import convert
    from guard.cli.parity import parity

    to = _option(convert, "to")
    against = _option(parity, "against")
    assert isinstance(to.type, click.Choice) and tuple(to.type.choices) == to_choices()
    assert isinstance(against.type, click.Choice) and tuple(against.type.choices) == against_choices()
    assert to_choices() == ("flax", "torch", "maxtext")
    assert against_choices() == ("tunix", "keras-hub", "easydel", "maxtext")
    for name in to_choices():  # the help says what each row says
        assert TARGETS[name].help in (to.help or "")
    for name in against_choices():
        assert f"{name}: {TARGETS[name].library} {TARGETS[name].version}" in (against.help or "")


@pytest.mark.parametrize("name", sorted(n for n, row in TARGETS.items() if row.side))
def test_every_side_exists_and_implements_the_protocol(name: str) -> None:
    from guard.worker.__main__ import SIDES, side_of

    side = importlib.import_module(TARGETS[name].side)  # the libraries themselves are imported only when used
    assert isinstance(side, Side) and isinstance(side.LIBRARY, str)
    assert SIDES[name] == TARGETS[name].side and side_of(name) is side


@pytest.mark.parametrize("name", list(TARGETS))
def test_every_row_names_what_exists(name: str) -> None:
    from guard.convert.steps import STEPS

    row = TARGETS[name]
    assert row.name == name and row.help and row.cites
    if row.environment:
        assert row.environment in ENVIRONMENTS and row.library and row.version
        assert row.version in ENVIRONMENTS[row.environment].checked
    for dotted in (row.writer, row.conventional_reference):
        if dotted:
            assert callable(resolve(dotted)), dotted
    for cause in row.causes:  # its words formatted with the values it is conditioned on, its dtypes parity's
        said = cause.says.format(**{key: value * 10 for key, value in cause.config_not.items()})
        assert said and not re.search(r"\{\w+[:!}]", said) and set(cause.dtypes) <= {"F32", "BF16", "F16"}, cause
        assert not cause.avoided_by or any(cause.avoided_by in load.options for load in row.loads), cause
    if row.loads:  # a stack --against checks: a side, an environment, loads labelled once, something mapped
        assert row.side and row.environment and row.model_types
        labels = [load.label for load in row.loads]
        assert len(set(labels)) == len(labels) and row.exact_load in labels
    for model_type, mapped in row.mapping.items():
        for pattern, template, steps in mapped:
            re.compile(pattern)
            assert ("{i}" in template) == bool(re.compile(pattern).groups), (model_type, pattern)
            assert set(steps) <= set(STEPS), (model_type, pattern, steps)
    for arch in row.architectures.values():
        for param in arch.params:
            assert set(param.steps) <= set(STEPS), (arch.name, param.maxtext, param.steps)
    if row.converts_to:
        assert TARGETS[row.converts_to].writer and TARGETS[row.converts_to].architectures


def test_the_worker_refuses_a_target_without_a_side() -> None:
    from guard.worker.__main__ import SIDES

    assert set(SIDES) == {n for n, row in TARGETS.items() if row.side}
    assert "torch" not in SIDES  # PyTorch's side runs in this process


def test_docs_table_is_the_generated_one() -> None:
    doc = (ROOT / "docs" / "jax.md").read_text(encoding="utf-8")
    assert markdown_table() in doc, "regenerate docs/jax.md's table with `python -m guard.targets`"


def _modules() -> list[Path]:
    return sorted(p for p in GUARD.rglob("*.py") if p not in TABLE_MODULES)


def _strings(node: ast.AST) -> set[str]:
    """The string constants a collection literal holds (a dict's keys; a list's, tuple's or set's elements)."""
    items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", [])
    return {item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)}


def test_no_other_module_lists_target_names() -> None:
    """A dict, list, tuple or set literal naming two targets anywhere but the table is a second registry.
    torch and flax are also the frameworks' names (a format's framework), so two of those alone are not."""
    names = set(TARGETS)
    offenders = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Dict, ast.List, ast.Tuple, ast.Set)):
                found = _strings(node) & names
                if len(found) >= 2 and not found <= {"torch", "flax"}:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {sorted(found)}")
    assert offenders == []


def test_no_other_module_writes_a_target_version() -> None:
    """A library's version is written once, in its environment's row: no other string literal of the package
    holds it (docstrings and comments may quote it; code takes it from the row)."""
    versions = {row.version for row in TARGETS.values() if row.version}
    offenders = []
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                hits = [v for v in versions if re.search(rf"(?<![\d.]){re.escape(v)}(?![\d])", node.value)]
                if hits:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {hits}")
    assert offenders == []


def test_the_table_imports_nothing_above_envs() -> None:
    """Plain data: writers, sides and causes are dotted strings, imported when used (guard.records is the
    package's one record type, below everything)."""
    allowed = ("guard.targets", "guard.envs", "guard.records")
    for path in sorted((GUARD / "targets").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("guard"):
                assert node.module.startswith(allowed), (path.name, node.module)
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("guard") and not a.name.startswith(allowed)
                               for a in node.names), path.name


def _write_probe(options: Any) -> int:
    """A test-only target's writer: what convert hands a writer, written down."""
    options.out.mkdir()
    (options.out / "written-by.json").write_text(json.dumps({"writer": "probe", "to": options.to,
                                                            "src": str(options.src), "dtype": options.dtype}))
    return 0


def _write_probe_back(options: Any) -> int:
    options.out.mkdir()
    (options.out / "written-by.json").write_text(json.dumps({"writer": "probe's way back", "to": options.to}))
    return 0


def _is_probe_layout(src: Path) -> bool:
    return (src / "probe-layout").is_file()


def test_a_new_target_is_a_row_and_nothing_else(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A row added to the table (here by monkeypatch, with the CLI unchanged) is a --to choice whose writer
    convert calls; a SRC in the row's own layout goes --to torch through the row's way back."""
    from guard.cli import main
    from guard.targets.__main__ import main as targets_main
    from guard.targets.table import Target

    here = __name__  # the test module, importable by name (resolve imports the dotted strings)
    monkeypatch.setitem(TARGETS, "probe", Target(
        name="probe", help="a test-only target", cites="tests/test_targets.py", writer=f"{here}:_write_probe",
        own_layout=f"{here}:_is_probe_layout", back_to="torch", back_writer=f"{here}:_write_probe_back"))
    assert "probe" in to_choices() and targets_main(["to"]) == 0 and "probe" in capsys.readouterr().out.split()
    src = tmp_path / "src"
    src.mkdir()
    assert main(["convert", str(src), "--to", "probe", "--out", str(tmp_path / "a"), "--dtype", "bf16"]) == 0
    assert json.loads((tmp_path / "a" / "written-by.json").read_text()) == {
        "writer": "probe", "to": "probe", "src": str(src), "dtype": "bf16"}
    (src / "probe-layout").write_text("")
    assert main(["convert", str(src), "--to", "torch", "--out", str(tmp_path / "b")]) == 0
    assert json.loads((tmp_path / "b" / "written-by.json").read_text()) == {"writer": "probe's way back",
                                                                           "to": "torch"}
    monkeypatch.delitem(TARGETS, "probe")
    assert main(["convert", str(src), "--to", "probe", "--out", str(tmp_path / "c")]) == 2  # gone: not a choice
    assert "'probe' is not one of" in capsys.readouterr().err and not (tmp_path / "c").exists()


def test_mapping_steps_are_the_libraries_own_transposes_and_reshapes() -> None:
    """tunix's transpose (1, 0) + reshape [hidden, heads, head_dim] and keras-hub's np.transpose + reshape are
    the vocabulary's heads_in / heads_out: the same arrays."""
    np = pytest.importorskip("numpy")
    pytest.importorskip("ml_dtypes")
    from guard.convert.steps import to_hf, to_target

    rng = np.random.default_rng(0)
    hidden, heads, head_dim = 8, 2, 4
    q = rng.standard_normal((heads * head_dim, hidden)).astype(np.float32)
    o = rng.standard_normal((hidden, heads * head_dim)).astype(np.float32)
    assert np.array_equal(to_target(q, ("heads_in",), head_dim), np.reshape(np.transpose(q, (1, 0)),
                                                                             (hidden, heads, head_dim)))
    assert np.array_equal(to_target(o, ("heads_out",), head_dim), np.reshape(np.transpose(o), (heads, head_dim,
                                                                                                 hidden)))
    for a, steps in ((q, ("heads_in",)), (o, ("heads_out",)), (q, ("transpose",))):
        assert np.array_equal(to_hf(to_target(a, steps, head_dim), steps, head_dim), a)


def test_the_choices_for_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    from guard.targets.__main__ import main as targets_main

    assert targets_main(["against"]) == 0 and capsys.readouterr().out.split() == list(against_choices())
    assert targets_main(["to"]) == 0 and capsys.readouterr().out.split() == list(to_choices())
    assert targets_main([]) == 0 and markdown_table() in capsys.readouterr().out
    assert targets_main(["stacks"]) == 2
    # what the Action installs beside ckpt-guard for each stack: the rows' extras and their environments' neighbours
    assert targets_main(["needs", "maxtext"]) == 0 and capsys.readouterr().out.split("\n")[:2] == ["extra parity",
                                                                                                  "extra orbax"]
    assert targets_main(["needs", "keras-hub"]) == 0  # keras and sentencepiece: in its overlay, `env install`'s
    assert capsys.readouterr().out.split() == ["extra", "parity"]
    assert targets_main(["needs", "torch"]) == 2  # not a stack --against takes


def test_the_action_describes_the_tables_stacks() -> None:
    """action.yml is static: its parity-against description names each stack the scripts accept (they ask the
    table, scripts/action/install.sh and against.sh), and no other."""
    import yaml

    described = yaml.safe_load((ROOT / "action.yml").read_text())["inputs"]["parity-against"]["description"]
    named = set(re.findall(r"[a-z][a-z0-9-]*", described)) & set(TARGETS)
    assert named == set(against_choices())
    for script in ("install.sh", "against.sh"):
        text = (ROOT / "scripts" / "action" / script).read_text()
        assert "guard.targets" in text and not any(f"|{name})" in text or f"{name}|" in text
                                                   for name in against_choices()), script
