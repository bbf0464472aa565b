"""Print guard/inventory/keep_fp32.py's table from an unpacked transformers wheel.

    pip download --no-deps "transformers>=5" -d /tmp/tf && unzip -q /tmp/tf/transformers-*.whl -d /tmp/tf/src
    python scripts/keep_fp32_table.py /tmp/tf/src/transformers

Every model class body that assigns ``_keep_in_fp32_modules`` or ``_keep_in_fp32_modules_strict`` a
literal list is read (AST only, nothing imported); the class's config (its ``config: XConfig``
annotation, or a base class's in the same file) names the model_type.  A model_type's rows are the
union over its classes, as transformers unites a model's submodules' lists when it loads.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def _literal_strings(node: ast.expr) -> list[str] | None:
    if isinstance(node, ast.Constant) and node.value is None:
        return []
    if isinstance(node, (ast.List, ast.Set, ast.Tuple)) and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return [e.value for e in node.elts]  # type: ignore[attr-defined]
    return None


def _config_types(models: Path) -> dict[str, str]:
    """Config class name -> model_type, from every configuration_*.py."""
    found: dict[str, str] = {}
    for path in sorted(models.glob("*/configuration_*.py")):
        for cls in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(cls, ast.ClassDef):
                continue
            for stmt in cls.body:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else \
                    [stmt.target] if isinstance(stmt, ast.AnnAssign) and stmt.value is not None else []
                for t in targets:
                    if isinstance(t, ast.Name) and t.id == "model_type" and isinstance(stmt.value, ast.Constant):
                        found[cls.name] = stmt.value.value
    return found


def _wrapped(line: str, width: int = 116) -> str:
    """One row, broken after commas into lines of at most ``width`` (the project's 120, less a margin)."""
    if len(line) <= width:
        return line
    lines, current = [], ""
    for piece in line.split(", "):
        if current and len(current) + len(piece) + 2 > width:
            lines.append(current + ",")
            current = " " * 12 + piece
        else:
            current = f"{current}, {piece}" if current else piece
    return "\n".join([*lines, current])


def _config_of(classes: dict[str, ast.ClassDef], name: str, seen: frozenset[str] = frozenset()) -> str | None:
    cls = classes.get(name)
    if cls is None or name in seen:
        return None
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == "config":
            ann = stmt.annotation
            return ann.id if isinstance(ann, ast.Name) else ann.value if isinstance(ann, ast.Constant) else None
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "config_class"
                                                for t in stmt.targets) and isinstance(stmt.value, ast.Name):
            return stmt.value.id
    for base in cls.bases:
        if isinstance(base, ast.Name):
            found = _config_of(classes, base.id, seen | {name})
            if found:
                return found
    return None


def main(argv: list[str]) -> int:
    root = Path(argv[0])
    models = root / "models"
    config_types = _config_types(models)
    table: dict[str, dict[str, set[str]]] = {}
    unread: list[str] = []
    for path in sorted(models.glob("*/modeling_*.py")):
        if "flax" in path.name or "_tf_" in path.name:
            continue
        classes = {c.name: c for c in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(c, ast.ClassDef)}

        for cls in classes.values():
            for stmt in cls.body:
                if not (isinstance(stmt, ast.Assign) or isinstance(stmt, ast.AnnAssign) and stmt.value is not None):
                    continue
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for t in targets:
                    if not (isinstance(t, ast.Name) and t.id in ("_keep_in_fp32_modules",
                                                                 "_keep_in_fp32_modules_strict")):
                        continue
                    values = _literal_strings(stmt.value)  # type: ignore[arg-type]
                    model_type = config_types.get(_config_of(classes, cls.name) or "")
                    if values is None or model_type is None:
                        unread.append(f"{path.relative_to(root)}:{stmt.lineno} {cls.name}")
                        continue
                    if values:
                        kind = "strict" if t.id.endswith("_strict") else "fp16"
                        table.setdefault(model_type, {"strict": set(), "fp16": set()})[kind].update(values)
    for model_type, kinds in sorted(table.items()):
        parts = [f"{k}={tuple(sorted(v))!r}" for k, v in (("strict", kinds["strict"]), ("fp16", kinds["fp16"]))
                 if v]
        print(_wrapped(f"    {model_type!r}: Keeps({', '.join(parts)}),"))
    for line in unread:
        print("# not read:", line, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
