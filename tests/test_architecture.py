"""The package layout: no import cycles, a scan imports what it uses, command groups load lazily, one record type."""

from __future__ import annotations

import ast
import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

GUARD = Path(__file__).resolve().parents[1] / "guard"


def _module_name(path: Path, root: Path = GUARD) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = GUARD) -> dict[str, set[str]]:
    """module -> the modules of ``root``'s package it imports, anywhere in its body (function-level imports too).

    ``from pkg import name`` runs ``pkg/__init__.py`` and reads ``name`` off it, so it is an edge to
    ``pkg`` even where ``name`` is a submodule (an edge to that submodule as well): a submodule
    that takes anything from its own package while the package's ``__init__`` imports it is a
    cycle, the one ``from guard.inventory import tf_dirs`` in ``guard.inventory.discovery`` was.
    ``from pkg.sub import name`` and ``import pkg.sub`` name the submodule, not the package's namespace.
    """
    modules = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names
                                   if f"{base}.{alias.name}" in modules)]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and (target + ".").startswith(root.name + "."):
                    graph[name].add(target)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_imports_one_that_imports_it_back() -> None:
    cycle = _cycle(import_graph())  # package __init__ files included: no exemption for re-exports
    assert cycle is None, " -> ".join(cycle or [])


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("back, cyclic", [
    ("from pkg import helper", True),  # reads the package's namespace while its __init__ runs
    ("from pkg import sibling", True),  # a submodule, but fetched through the package
    ("from . import sibling", True),
    ("import pkg", True),
    ("from pkg.sibling import helper", False),  # names the submodule itself
    ("import pkg.sibling", False),
])
def test_the_cycle_check_finds_a_function_level_cycle_through_a_package_init(tmp_path: Path, back: str,
                                                                              cyclic: bool) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from pkg.user import use\nfrom pkg.sibling import helper\n")
    (package / "sibling.py").write_text("def helper() -> None:\n    pass\n")
    (package / "user.py").write_text(f"def use() -> None:\n    {back}\n")
    cycle = _cycle(import_graph(package))
    assert (cycle is not None) == cyclic, cycle
    if cyclic:
        assert cycle is not None and cycle[0] == cycle[-1] and "pkg.user" in cycle


# The layers, lowest first: a module may import its own layer's modules and any lower layer's, never a higher
# one's (docs/architecture.md draws them).  A module belongs to the layer of the longest prefix naming it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("guard", *(f"guard.{name}" for name in (
        "errors", "records", "dtypes", "fixes", "findings", "catalogue", "config", "jsonload", "jsonspan", "paths",
        "atomic", "lazy", "quiet", "progress", "tensors", "collector", "sources")))),
    ("envs", ("guard.envs",)),  # other Python environments and the parent side of the worker protocol
    ("targets", ("guard.targets",)),  # data only: writers and sides named by dotted strings, imported lazily
    ("readers", ("guard.readers",)),
    ("training", ("guard.training",)),  # what trainers write, read as it is; conversion of it lives in convert
    ("inventory", ("guard.inventory",)),
    ("rules and report", ("guard.rules", "guard.report", "guard.reporters")),
    ("write", ("guard.write",)),
    ("convert", ("guard.convert",)),
    ("values", ("guard.values",)),
    ("scan", ("guard.scan",)),  # below diff and hub, which scan both sides
    ("parity", ("guard.parity",)),
    ("worker sides", ("guard.worker",)),  # the child side of the worker protocol, in the target's environment
    ("against", ("guard.against",)),
    ("fix", ("guard.fix",)),
    ("diff", ("guard.diff",)),
    ("hub", ("guard.hub",)),
    ("commands", ("guard.cli", "guard.__main__", "guard.demo", "guard.samples")),
)
# Imports up the layers that a change in flight removes: (importer, imported prefix, who and where).  This list
# must end empty: an entry is deleted with the import it excuses, never added to.
KNOWN_AND_OWNED: tuple[tuple[str, str, str], ...] = ()


def layer_of(module: str) -> int:
    best, found = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), index
    if found < 0:
        raise AssertionError(f"{module} is in no layer: add its package to LAYERS")
    return found


def _owned(importer: str, imported: str) -> bool:
    return any(importer == who and (imported == what or imported.startswith(what + "."))
               for who, what, _ in KNOWN_AND_OWNED)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
            for module in sorted(graph) for target in sorted(graph[module])
            if layer_of(target) > layer_of(module) and not _owned(module, target)]


def package_of(module: str) -> str:
    """``guard.training.dcp.dirs`` -> ``guard.training``; a top-level module is a package of its own."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {package_of(m): set() for m in graph}
    for module, targets in graph.items():
        packages[package_of(module)] |= {package_of(t) for t in targets
                                         if package_of(t) != package_of(module) and not _owned(module, t)}
    return packages


def test_every_module_is_in_a_layer() -> None:
    for module in import_graph():
        layer_of(module)


def test_no_import_runs_up_the_layers() -> None:
    assert upward_imports(import_graph()) == []


def test_no_package_imports_one_that_imports_it_back() -> None:
    cycle = _cycle(package_graph(import_graph()))
    assert cycle is None, " -> ".join(cycle or [])


def test_every_owned_upward_import_is_still_there() -> None:
    """An owned entry whose import is gone is stale: delete it, so that the list only ever shrinks."""
    graph = import_graph()
    stale = [(who, what) for who, what, _ in KNOWN_AND_OWNED
             if not any(t == what or t.startswith(what + ".") for t in graph.get(who, ()))]
    assert stale == []


def test_the_layer_check_finds_an_upward_import() -> None:
    graph = {"guard.readers.x": {"guard.errors"}, "guard.training.y": {"guard.convert.z"}, "guard.convert.z": set()}
    assert upward_imports(graph) == ["guard.training.y (training) imports guard.convert.z (convert)"]
    assert _cycle(package_graph({"guard.a.x": {"guard.b.y"}, "guard.b.y": {"guard.a.z"}, "guard.a.z": set()}))


def test_options_module_imports_no_command() -> None:
    graph = import_graph()
    commands = {f"guard.cli.{name}" for name in ("scan", "rules", "report", "convert", "parity", "hub")}
    for shared in ("guard.cli.options", "guard.cli.flags", "guard.cli.run"):
        assert not graph[shared] & commands, shared
    outside = {m for m in graph if not m.startswith("guard.cli") and m != "guard.__main__"}
    assert not {m for m in outside if graph[m] & ({"guard.cli"} | commands)}


# What `ckpt-guard scan model.safetensors` may import from guard: a stray import fails here.
SCAN_MODULES = {
    "guard", "guard.catalogue", "guard.cli", "guard.cli.flags", "guard.cli.run", "guard.collector", "guard.config",
    "guard.dtypes", "guard.errors", "guard.findings", "guard.fixes", "guard.inventory", "guard.inventory.conventions",
    "guard.jsonload",  # the one JSON reader (json's public API)
    "guard.inventory.discovery", "guard.inventory.model", "guard.lazy", "guard.inventory.names",
    "guard.inventory.pipelines",
    "guard.inventory.package_dirs",  # IR pairs and Core ML packages are found by name in every directory
    "guard.inventory.tf_dirs",  # TF bundles and SavedModel folders, likewise (stdlib only)
    "guard.inventory.sets",
    "guard.inventory.quant_conventions", "guard.inventory.quantization",  # quantized sets (their rules: lazily)
    "guard.inventory.stats",  # guard.jsonspan (CG103's fix) only where config.json's dtype is to be rewritten
    "guard.paths",  # local paths as strings: no pathlib (nor the urllib.parse and ipaddress it imports)
    "guard.readers", "guard.readers.lfs", "guard.readers.safetensors", "guard.records",
    "guard.readers.safetensors.fast", "guard.readers.safetensors.pattern", "guard.readers.safetensors.reference",
    "guard.readers.safetensors.templates", "guard._speedups",  # the header's one fast core; the private C functions
    "guard.report",
    "guard.reporters", "guard.reporters.inert", "guard.reporters.text", "guard.rules", "guard.rules.config_dtype",
    "guard.rules.copies", "guard.rules.dtype_fixes", "guard.rules.dtype_policy", "guard.rules.formats",
    "guard.rules.no_tensors",
    "guard.rules.norms",
    "guard.rules.shards", "guard.rules.targets",  # pickle_only and quantized: only for torch / quantized sets
    "guard.rules.training", "guard.rules.variants", "guard.scan", "guard.sources", "guard.tensors",
    "guard.training", "guard.training.registry",  # the trainers' marker names (their readers: only where one is)
}
HEAVY = ("click", "dataclasses", "inspect", "typing", "torch", "jax", "flax", "numpy", "transformers",
         "huggingface_hub", "onnx", "h5py", "tensorstore",
         "safetensors", "msgpack", "zipfile", "pickle", "pickletools", "tomllib", "tempfile")


def test_a_safetensors_scan_imports_exactly_what_it_uses(tmp_path: Path) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    code = ("import sys, json\nfrom guard.cli import main\n"
            f"rc = main(['scan', '--no-summary', {str(tmp_path / 'model.safetensors')!r}])\n"
            "print(json.dumps([rc, sorted(m for m in sys.modules if m.split('.')[0] == 'guard'),"
            " sorted(m for m in sys.modules)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    rc, guard_modules, every_module = json.loads(out.stdout.splitlines()[-1])
    assert rc == 0
    assert set(guard_modules) == SCAN_MODULES
    assert not [m for m in HEAVY if m in every_module]


def test_the_hooks_scan_imports_no_pathlib(tmp_path: Path) -> None:
    """The pre-commit hook's line: pathlib with urllib.parse and ipaddress cost ~3 ms of a ~35 ms call;
    fnmatch (globs beyond the default ``*word*`` ones) and importlib are imported only where needed.

    Run with ``-S`` and the tree on PYTHONPATH: an editable install's import finder uses pathlib itself.
    """
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    folder = tmp_path / "component" / "sub"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    (folder / "config.json").write_text("{}")
    (tmp_path / "component" / "model_index.json").write_text('{"sub": ["diffusers", "UNet2DModel"]}')
    code = ("import sys, json\nfrom guard.cli import main\n"
            "rc = main(['scan', '--format', 'text', '--no-summary', 'component/sub/model.safetensors',"
            " './component//sub/config.json'])\n"
            "print(json.dumps([rc, sorted(m for m in sys.modules)]))")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True,
                         cwd=tmp_path, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    rc, modules = json.loads(out.stdout.splitlines()[-1])
    assert rc == 0
    assert not {"pathlib", "urllib.parse", "ipaddress", "fnmatch", "importlib", "typing"} & set(modules)


@pytest.mark.parametrize("group, module, args", [
    ("convert", "torch", ["convert", "m", "--to", "flax", "--out", "o"]),
    ("parity", "transformers", ["parity", "a", "b"]),
    ("hub", "huggingface_hub", ["hub", "scan", "org/model"]),
])
def test_a_group_whose_extra_is_missing_is_listed_and_fails_with_the_hint(tmp_path: Path, group: str, module: str,
                                                                          args: list[str]) -> None:
    (tmp_path / "m").mkdir()
    for side in ("a", "b"):  # parity's two models, each with the config.json it is built from
        (tmp_path / side).mkdir()
        (tmp_path / side / "config.json").write_text("{}")
    code = (f"import sys; sys.modules[{module!r}] = None\nfrom guard.cli import main\n"
            f"print('HELP', main(['--help']))\nraise SystemExit(main({args!r}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"  {group} " in result.stdout and "HELP 0" in result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "pip install 'ckpt-guard[" in lines[0], result.stderr


PLAIN = [
    ["scan", "m"], ["scan", "--format", "json", "--no-summary", "a", "b"], ["scan", "--format=sarif", "-o", "r.sarif"],
    ["scan", "--expect", "bf16", "--keep-fp32", "*router*", "--keep-fp32", "*gate*", "x"],
    ["scan", "--target", "torch:fp16", "--select", "CG1", "--extend-select", "CG2", "--ignore", "CG104", "--fail-on",
     "warning", "--values", "x"], ["scan", "--", "--format"], ["scan"], ["scan", "-f", "github", "-"],
]
ODD = [
    ["scan", "--help"], ["scan", "-h"], ["scan", "--format", "xml"], ["scan", "--bogus"], ["scan", "-fjson"],
    ["scan", "--values=1"], ["scan", "--expect"], ["scan", "--expect", "--values"], ["scan", "--config", "."],
    ["scan", "--no-sum"],
]


@pytest.mark.parametrize("args", PLAIN, ids=lambda a: " ".join(a))
def test_plain_scan_spellings_parse_as_click_parses_them(args: list[str]) -> None:
    from guard.cli.flags import SCAN_FLAGS, parse_plain
    from guard.cli.scan import scan

    parsed = parse_plain(args[1:], SCAN_FLAGS)
    assert parsed is not None
    ctx = scan.make_context("scan", list(args[1:]))
    options, paths = parsed
    click_params = dict(ctx.params)
    assert tuple(str(p) for p in click_params.pop("paths")) == tuple(paths)
    assert click_params == options


@pytest.mark.parametrize("args", ODD, ids=lambda a: " ".join(a))
def test_anything_else_is_left_to_click(args: list[str]) -> None:
    from guard.cli.flags import SCAN_FLAGS, parse_plain

    assert parse_plain(args[1:], SCAN_FLAGS) is None


def test_the_flag_table_knows_every_output_format() -> None:
    from guard.cli.flags import FORMATS
    from guard.reporters import REPORTERS

    assert FORMATS == tuple(REPORTERS)


def _record_rule_breaks(root: Path = GUARD) -> list[str]:
    """Where a module declares a value type other than ``class X(Record)`` (guard.records, the one record type).

    A ``@dataclass`` stays only on mutable state, its decorator line saying ``# mutable: <what changes it>``,
    or on a value that must not be a tuple, saying ``# not a tuple: <why>`` (the torch pickle's descriptions,
    on a stack where a tuple is one the pickle built).  ``frozen=True`` belongs to the second kind only.
    """
    breaks: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if path == root / "records.py":
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        where = path.relative_to(root.parent)
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    if (base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)) == "NamedTuple":
                        breaks.append(f"{where}:{node.lineno}: {node.name} is a NamedTuple, not a Record")
                for decorator in node.decorator_list:
                    target = decorator.func if isinstance(decorator, ast.Call) else decorator
                    name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)
                    line = lines[decorator.lineno - 1]
                    if name == "record":
                        breaks.append(f"{where}:{decorator.lineno}: @record on {node.name}: write class X(Record)")
                    elif name == "dataclass":
                        frozen = isinstance(decorator, ast.Call) and any(
                            k.arg == "frozen" and isinstance(k.value, ast.Constant) and k.value.value is True
                            for k in decorator.keywords)
                        if "# not a tuple:" not in line and (frozen or "# mutable:" not in line):
                            breaks.append(f"{where}:{decorator.lineno}: {node.name} is a dataclass"
                                          f"{' (frozen)' if frozen else ''} with no '# mutable:' on its decorator line")
            elif isinstance(node, ast.Call):
                func = node.func
                if (func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)) == "namedtuple":
                    breaks.append(f"{where}:{node.lineno}: namedtuple(): write a class X(Record)")
    return breaks


def test_every_value_type_is_a_record() -> None:
    """One record type across the package (issue 40): an immutable value with fields is ``class X(Record)``."""
    assert _record_rule_breaks() == []


def test_the_record_rule_finds_each_other_kind(tmp_path: Path) -> None:
    package = tmp_path / "guard"
    package.mkdir()
    (package / "records.py").write_text("def record(cls): ...\n")
    (package / "kinds.py").write_text(
        "import collections\nfrom dataclasses import dataclass\nfrom typing import NamedTuple\n\n"
        "class A(NamedTuple):\n    x: int\n\n"
        "@dataclass(frozen=True)\nclass B:\n    x: int\n\n"
        "@dataclass\nclass C:\n    x: int\n\n"
        "@dataclass  # mutable: the loop counts into x\nclass D:\n    x: int\n\n"
        "@dataclass(frozen=True)  # mutable: frozen, so not mutable\nclass E:\n    x: int\n\n"
        "@dataclass(frozen=True, slots=True)  # not a tuple: a tuple means one\nclass F:\n    x: int\n\n"
        "G = collections.namedtuple('G', 'x')\n")
    assert [b.split(": ", 1)[0] for b in _record_rule_breaks(package)] == [
        "guard/kinds.py:5", "guard/kinds.py:8", "guard/kinds.py:12", "guard/kinds.py:20", "guard/kinds.py:28"]


# docs/architecture.md's claims, checked (issue 48): the page is a map only while it matches the tree.
ARCHITECTURE = GUARD.parent / "docs" / "architecture.md"


def _top_level_names(root: Path = GUARD) -> dict[str, set[str]]:
    """module -> the names its body defines at the top level (functions, classes, assignments)."""
    names: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        found: set[str] = set()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(node.name)
            elif isinstance(node, ast.Assign):
                found.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                found.add(node.target.id)
        names[_module_name(path, root)] = found
    return names


def _section(heading: str) -> str:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def _unresolved(token: str, names: dict[str, set[str]]) -> bool:
    """Whether a name the page gives in backticks (``catalogue.RULES``, ``guard/readers/``, ``CHECKS``,
    ``inventory/conventions.py``, ``targets/table.TARGETS``) is missing from the tree."""
    import re

    root = GUARD.parent
    if token.startswith("test_"):
        return not any(f"def {token}(" in test.read_text(encoding="utf-8") for test in (root / "tests").glob("*.py"))
    if token.endswith("/") or token.endswith(".py") or token.endswith(".bin"):
        if "/" not in token:
            return not any(GUARD.rglob(token))  # a module the sentence places (convert/read/'s source_orbax.py)
        return not any((base / token).exists() for base in (root, GUARD))
    if token in names:
        return False  # a module: guard.envs.worker
    module, _, attr = token.replace("/", ".").rpartition(".")
    module = module.removeprefix("guard.")
    if not module:  # a bare name: a table of the package, or one of the Makefile's variables
        return not any(attr in found for found in names.values()) \
            and not re.search(rf"^{attr} *:?=|\b{attr}=", (root / "Makefile").read_text(encoding="utf-8"), re.M)
    owners = [m for m in names if m == f"guard.{module}" or m.endswith(f".{module}")]
    return not any(attr in names[m] for m in owners)


def _doc_tokens(text: str) -> list[str]:
    import re

    return [t for t in re.findall(r"`([^`\s]+)`", text)
            if re.fullmatch(r"[A-Za-z_][\w./]*", t) and not t.startswith(("tests/", "--"))
            and ("." in t or "/" in t or t.isupper() or t.startswith(("_", "test_")))]


def test_the_pages_layers_are_the_checked_layers() -> None:
    """The layers table of docs/architecture.md, row by row, names the prefixes ``LAYERS`` checks."""
    import re

    rows = [line for line in _section("Layers").splitlines() if line.startswith("| ") and "`" in line.split("|")[1]]
    drawn = []
    for row in rows:
        names = set()
        for token in re.findall(r"`([^`]+)`", row.split("|")[1]):
            name = token.removeprefix("guard/").removesuffix(".py").rstrip("/").replace("/", ".")
            names.add("guard" if name == "__init__" else f"guard.{name}")
        drawn.append(names)
    assert drawn == [set(prefixes) for _, prefixes in LAYERS]


def test_every_registry_and_recipe_name_on_the_page_exists() -> None:
    """Each table the Registries section places (`file` `NAME`) is assigned there, and every name and path the
    sections name (``rules.CHECKS``, ``readers.sniff_format``, ``guard/training/pickles.py``) is in the tree."""
    import re

    names = _top_level_names()
    registries = _section("Registries")
    placed = re.findall(r"`(guard/[\w/]+)\.py` `([A-Z_]+)`", registries)
    assert len(placed) >= 12
    for path, table in placed:
        assert table in names[_module_name(GUARD.parent / f"{path}.py")], f"{path}.py has no {table}"
    sections = ("Registries", "Where a new row goes", "Pipelines")  # "Places a new row touches" names the past
    tokens = [t for heading in sections for t in _doc_tokens(_section(heading))]
    missing = sorted({t for t in tokens if _unresolved(t, names)})
    assert missing == []


def test_the_page_check_finds_a_stale_name() -> None:
    names = _top_level_names()
    assert not _unresolved("rules.CHECKS", names) and not _unresolved("readers.sniff_format", names)
    assert not _unresolved("guard/training/pickles.py", names) and not _unresolved("EXTENSION_FORMATS", names)
    assert _unresolved("rules.NO_SUCH_TABLE", names) and _unresolved("guard/nowhere.py", names)
    assert _unresolved("NO_SUCH_TABLE", names) and not _unresolved("MANAGED_VENVS", names)


def _tables() -> dict[str, frozenset[str]]:
    """Each registry's names: the tables docs/architecture.md lists, read as their code reads them."""
    from guard.catalogue import RULES
    from guard.cli.root import COMMANDS
    from guard.convert.read.dequant import DEQUANTIZERS
    from guard.diff.render import VIEWS
    from guard.envs.registry import ENVIRONMENTS
    from guard.fixes import ACTIONS
    from guard.readers import READERS
    from guard.reporters import REPORTERS
    from guard.targets.table import TARGETS
    from guard.training.registry import TRAINERS

    return {"READERS": frozenset(READERS), "REPORTERS": frozenset(REPORTERS), "VIEWS": frozenset(VIEWS),
            "ACTIONS": frozenset(ACTIONS), "TARGETS": frozenset(TARGETS), "ENVIRONMENTS": frozenset(ENVIRONMENTS),
            "COMMANDS": frozenset(COMMANDS), "DEQUANTIZERS": frozenset(DEQUANTIZERS),
            "TRAINERS": frozenset(t.layout for t in TRAINERS), "RULES": frozenset(r.code for r in RULES)}


def second_lists(tables: dict[str, frozenset[str]], root: Path = GUARD) -> list[str]:
    """Literals (a tuple, list or set of strings, or a dict's keys) that spell a table's names again."""
    by_names = {names: table for table, names in tables.items() if len(names) >= 3}
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        own = {id(node.value) for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
               and node.value is not None
               and any(isinstance(t, ast.Name) and t.id in tables
                       for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))}
        for node in ast.walk(tree):
            if id(node) in own:
                continue
            items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None) \
                if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else None
            if not items or not all(isinstance(i, ast.Constant) and isinstance(i.value, str) for i in items):
                continue
            table = by_names.get(frozenset(i.value for i in items))  # type: ignore[union-attr]  # checked above: str constants
            if table is not None:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} lists {table}' names again")
    return found


def test_no_second_list_of_a_tables_names() -> None:
    """'Never a second list' (docs/architecture.md), checked: a list of a table's names is derived from it."""
    assert second_lists(_tables()) == []


def test_the_second_list_check_finds_a_copy(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "table.py").write_text('READERS = {"a": 1, "b": 2, "c": 3}\n')
    (package / "copy.py").write_text('FORMATS = ("c", "a", "b")  # the same names, in another order\n'
                                     'OTHER = ("a", "b")\n')
    found = second_lists({"READERS": frozenset("abc")}, package)
    assert found == ["pkg/copy.py:1 lists READERS' names again"]


# Code named by imports (issue 48): every "module:function" string of every table goes through guard.lazy.resolve,
# and each entry is checked against what its caller calls it with.  The references below are those calls'
# signatures; an annotation given here must match the entry's (as written: every module has postponed annotations).
if TYPE_CHECKING:  # the names the references' annotations spell, for a reader and a type checker
    import numpy as np

    from guard.config import Policy
    from guard.convert.read.dequant import Read
    from guard.convert.read.source import SourceModel
    from guard.diff.change import ChangeReport
    from guard.fix.context import ActionContext, Staged
    from guard.fixes import Fix
    from guard.inventory import ModelInventory
    from guard.report import Report
    from guard.sources import ByteSource
    from guard.tensors import FileScan
    from guard.training.dirs import TrainingDir


def _reader(source: ByteSource) -> FileScan: ...  # guard.readers.reader_for
def _renderer(report: Report) -> str: ...  # guard.reporters.render
def _view(change: ChangeReport) -> str: ...  # guard.diff.render.render_change
def _action(fix: Fix, ctx: ActionContext) -> Staged: ...  # guard.fix.actions.stage
def _check(inventory: ModelInventory, policy: Policy): ...  # noqa: ANN201  # guard.rules.check_model: an iterable
def _dequantize(module: Any, quant: Any, read: Read) -> dict[str, np.ndarray]: ...  # guard.convert.read.dequant
def _claim(directory: str, names: frozenset[str]) -> TrainingDir | None: ...  # guard.training.dirs
def _scan(found: TrainingDir, *, name: str) -> FileScan: ...  # guard.training.dirs
def _find_checkpoint(src: Path) -> tuple[Path, Path] | None: ...  # guard.convert.read.source_training
def _open_checkpoint(checkpoint: Path) -> SourceModel: ...  # likewise
def _adapter(source: SourceModel, config: dict[str, Any] | None) -> SourceModel: ...  # likewise
def _reference(src: Path, config: dict[str, Any], input_ids: Any) -> dict[str, Any] | None: ...  # guard.against.run
def _smoke() -> str: ...  # guard.envs.build: an environment's smoke test


def _annotation(value: object) -> str:
    return str(value).replace(" ", "").replace("'", "")


def signature_breaks(found: object, reference: object) -> str | None:
    """Why ``found`` cannot be called as ``reference`` is (its arguments, keywords and annotated types), or None."""
    import inspect

    if not callable(found):
        return f"{found!r} is not callable"
    got, want = inspect.signature(found), inspect.signature(reference)  # type: ignore[arg-type]  # a callable
    params = [p for p in want.parameters.values() if p.name != "self"]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    try:
        got.bind(*[None] * len(positional), **{p.name: None for p in params if p.kind == p.KEYWORD_ONLY})
    except TypeError as exc:
        return f"{got} cannot be called as {want}: {exc}"
    taken = [p for p in got.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    pairs = [*zip(positional, taken), *((p, got.parameters[p.name]) for p in params if p.kind == p.KEYWORD_ONLY
                                        and p.name in got.parameters)]
    for w, g in pairs:
        if w.annotation is not w.empty and g.annotation is not g.empty \
                and _annotation(w.annotation) != _annotation(g.annotation):
            return f"{got}: {g.name} is {g.annotation}, its caller passes {w.annotation}"
    if want.return_annotation is not want.empty and got.return_annotation is not got.empty \
            and _annotation(want.return_annotation) != _annotation(got.return_annotation):
        return f"{got} returns {got.return_annotation}, its caller expects {want.return_annotation}"
    return None


def named_code() -> list[tuple[str, str, object]]:
    """(where, "module:function" or "module", what it must be) for every entry of every table that names code."""
    import click

    from guard.cli.convert import OwnLayout, Writer
    from guard.cli.root import COMMANDS
    from guard.convert.read.dequant import DEQUANTIZERS
    from guard.diff.render import VIEWS
    from guard.envs.registry import ENVIRONMENTS
    from guard.fixes import ACTIONS
    from guard.readers import READERS
    from guard.reporters import REPORTERS
    from guard.rules import CHECKS, Deferred
    from guard.targets.table import TARGETS
    from guard.training.registry import TRAINERS
    from guard.worker.side import Side

    entries: list[tuple[str, str, object]] = []
    entries += [(f"READERS[{k}]", v, _reader) for k, v in READERS.items()]
    entries += [(f"REPORTERS[{k}]", v, _renderer) for k, v in REPORTERS.items()]
    entries += [(f"VIEWS[{k}]", v, _view) for k, v in VIEWS.items()]
    entries += [(f"ACTIONS[{k}]", v, _action) for k, v in ACTIONS.items()]
    entries += [(f"DEQUANTIZERS[{k}]", v, _dequantize) for k, v in DEQUANTIZERS.items()]
    entries += [(f"CHECKS[{code}]", check.dotted, _check) for code, check in CHECKS if isinstance(check, Deferred)]
    entries += [(f"COMMANDS[{k}]", v, click.Command) for k, (v, _) in COMMANDS.items()]
    entries += [(f"ENVIRONMENTS[{k}].smoke", v.smoke, _smoke) for k, v in ENVIRONMENTS.items() if v.smoke]
    for name, row in TARGETS.items():
        for field, protocol in (("writer", Writer.__call__), ("back_writer", Writer.__call__),
                                ("own_layout", OwnLayout.__call__), ("side", Side),
                                ("conventional_reference", _reference)):
            if getattr(row, field):
                entries.append((f"TARGETS[{name}].{field}", getattr(row, field), protocol))
    for trainer in TRAINERS:
        where = f"TRAINERS[{trainer.layout}]"
        entries += [(f"{where}.claim", trainer.claim, _claim), (f"{where}.scan", trainer.scan, _scan)]
        if trainer.source:
            entries += [(f"{where}.source", f"{trainer.source}:find_checkpoint", _find_checkpoint),
                        (f"{where}.source", f"{trainer.source}:open_checkpoint", _open_checkpoint)]
        entries += [(f"{where}.adapters", adapter, _adapter) for adapter in trainer.adapters]
    return entries


def protocol_breaks(entries: list[tuple[str, str, object]]) -> list[str]:
    from guard.lazy import resolve

    breaks: list[str] = []
    for where, dotted, protocol in entries:
        try:
            found = resolve(dotted)
        except (ImportError, AttributeError) as exc:
            breaks.append(f"{where} = {dotted!r} does not resolve: {exc}")
            continue
        if isinstance(protocol, type):  # a module implementing a runtime Protocol, or an instance of a class
            if not isinstance(found, protocol):
                breaks.append(f"{where} = {dotted!r} is no {protocol.__name__}")
        elif (why := signature_breaks(found, protocol)) is not None:
            breaks.append(f"{where} = {dotted!r}: {why}")
    return breaks


def test_every_table_entry_that_names_code_resolves_and_meets_its_callers_signature() -> None:
    entries = named_code()
    assert len(entries) >= 80
    assert protocol_breaks(entries) == []


def test_the_protocol_check_finds_a_wrong_entry() -> None:
    from guard.cli.convert import Writer

    wrong = [("READERS[x]", "guard.readers.nowhere:read", _reader),
             ("READERS[y]", "guard.readers.safetensors:no_such_reader", _reader),
             ("REPORTERS[z]", "guard.reporters.text:render_text", _action),  # called with two arguments
             ("TARGETS[t].writer", "guard.cli.convert_maxtext:is_maxtext_source", Writer.__call__),  # Path, not options
             ("ACTIONS[a]", "guard.fix.actions.cast:stage_set_cast", _smoke),
             ("COMMANDS[c]", "guard.cli.convert:write_hf_layout", __import__("click").Command)]
    assert [line.split(" ")[0] for line in protocol_breaks(wrong)] == [w for w, _, _ in wrong]


def test_no_code_resolves_a_table_entry_but_guard_lazy() -> None:
    """One resolver: no module but guard.lazy imports a table's code by name (importlib.import_module, getattr
    on __import__), so a table entry is resolved and checked one way."""
    import re

    found = set()
    for path in sorted(GUARD.rglob("*.py")):
        if path != GUARD / "lazy.py" and re.search(r"importlib\.import_module\(|__import__\(", path.read_text("utf-8")):
            found.add(str(path.relative_to(GUARD).as_posix()))
    assert found == set(EXTERNAL_IMPORTS)


# Modules that import by a computed name that is no table's entry: a library's optional parts, probed or walked.
EXTERNAL_IMPORTS: dict[str, str] = {
    "diff/values.py": "numpy probed, for the one-line hint when it is missing",
    "hub/service.py": "the service's optional libraries probed, likewise",
    "hub/errors.py": "huggingface_hub's error classes where its version has them",
    "parity/run.py": "parity's libraries probed before a run",
    "envs/build.py": "in the environment being built (no guard there yet): its imports, and its row's smoke test",
    "worker/flax_side.py": "transformers 4's Flax modules, warmed",
    "worker/tunix_side.py": "tunix's per-architecture model and params modules",
}


def _marker_files(marker: str) -> set[str]:
    import re

    pattern = re.compile((r"(?m)^" if marker[0].isupper() else r"(?<![\w.])") + re.escape(marker))
    return {path.relative_to(GUARD.parent).as_posix() for path in GUARD.rglob("*.py")
            if pattern.search(path.read_text(encoding="utf-8"))}


def test_the_speed_tricks_are_where_the_page_says() -> None:
    """docs/architecture.md lists every speed trick on the hook's line with its figure (issue 48): each row's
    marker stands in exactly the files the row names (or as many modules as it counts), and no row is stale."""
    import re

    rows = [line.split("|")[1:4] for line in _section("Speed tricks on the hook's line").splitlines()
            if line.startswith("| ") and "(`" in line]
    assert len(rows) >= 8
    for trick, where, figure in rows:
        marker = re.findall(r"\(`([^`]+)`", trick)[-1]
        if marker.startswith("guard."):
            continue  # a module's way of working, held by its own test (test_the_hooks_scan_imports_no_pathlib)
        found = _marker_files(marker)
        counted = re.fullmatch(r"\s*(\d+) modules\s*", where)
        if counted:
            assert len(found) == int(counted[1]), (marker, sorted(found))
        else:
            named = set(re.findall(r"`(guard/[\w/]+\.py)`", where.split("(")[0]))
            assert found == named, (marker, sorted(found))
        assert re.search(r"\d", figure) or "not measured" in figure, trick
