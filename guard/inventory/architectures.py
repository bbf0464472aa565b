"""What a config's model class would do with a file's tensors: fill, drop, or refuse (by shape).

Pure: names and shapes in, a ``Loading`` out; the table (``guard.inventory.architectures_table``) says
which weights transformers 5 builds for a ``model_type`` and class.  The file's names are first renamed
and merged as transformers does at load (per-expert tensors into the fused parameter), so the
per-expert layout and the fused one are judged alike, and an expert the file lacks is named even
where transformers is silent (it merges the experts it finds and leaves the rest random).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from guard.records import Record

_NAME = r"[a-z_][a-z0-9_.]*"  # a config field; a sub-config's as text_config.hidden_size
_EXPRESSION = re.compile(rf"^(?:(\d+)\*)?({_NAME}(?:\*{_NAME})*)?(?://\(?([a-z0-9_.*]+)\)?)?$")


class Mismatch(Record):
    tensor: str
    shape: tuple[int, ...]
    expected: tuple[int | None, ...]
    fields: tuple[str, ...]  # per dimension: the config expression it follows ("" where unchecked)


class Loading(Record):
    class_name: str
    missing: tuple[str, ...]  # parameters no tensor fills (random at load)
    missing_experts: tuple[tuple[str, tuple[int, ...], int], ...]  # fused parameter, absent experts, of how many
    unexpected: tuple[str, ...]  # file tensors with no place (dropped at load)
    mismatched: tuple[Mismatch, ...]  # shapes the config contradicts (load raises)
    extra_layers: tuple[tuple[str, str, int], ...]  # (container, count field, layers the file holds) when whole


def table_row(config: Mapping[str, object]) -> tuple[str, object] | str:
    """(class name, Row) for config.json, or why there is none (the check does not run)."""
    from guard.inventory.architectures_table import ARCHITECTURES

    model_type = config.get("model_type")
    rows = ARCHITECTURES.get(model_type) if isinstance(model_type, str) else None
    if rows is None:
        return f"model_type {model_type!r} has no row in the table of architectures"
    names = config.get("architectures")
    wanted = names[0] if isinstance(names, list) and names and isinstance(names[0], str) else next(iter(rows))
    if wanted in rows:
        return wanted, rows[wanted]
    # The base class itself (BertModel): a head class builds it under its prefix, but some heads leave a part
    # out (BertForMaskedLM has no pooler), so the row with the most names under the prefix is the base's whole.
    bases = [row for row in rows.values() if row.base and row.base == wanted]
    if bases:
        return wanted, max(bases, key=_names_under_prefix)
    return f"{wanted} (model_type {model_type!r}) has no row in the table of architectures"


def evaluate(expression: object, config: Mapping[str, object]) -> int | None:
    """An expression of the table over config.json's fields (a text_config's where the top lacks one)."""
    if isinstance(expression, int) or expression is None:
        return expression
    match = _EXPRESSION.match(str(expression))
    if match is None:
        return None
    constant, product, divisor = match.groups()
    value = int(constant) if constant else 1
    for name in (product.split("*") if product else ()):
        field = _field(config, name)
        if field is None:
            return None
        value *= field
    for name in (divisor.split("*") if divisor else ()):
        field = int(name) if name.isdigit() else _field(config, name)
        if not field:
            return None
        value //= field
    return value


def _field(config: Mapping[str, object], name: str) -> int | None:
    if "." in name:
        head, _, rest = name.partition(".")
        sub = config.get(head)
        return _field(sub, rest) if isinstance(sub, dict) else None
    value = config.get(name)
    if value is None and isinstance(config.get("text_config"), dict):
        value = config["text_config"].get(name)  # type: ignore[attr-defined]  # text_config is a dict: checked on the line above
    if name == "head_dim" and value is None:
        hidden, heads = _field(config, "hidden_size"), _field(config, "num_attention_heads")
        return hidden // heads if hidden and heads else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _layer_kind(layers: object, index: int, config: Mapping[str, object]) -> str:
    selector = layers.selector  # type: ignore[attr-defined]  # a table Layers record, typed object: the table is imported lazily
    if selector == "first_k_dense_replace":
        return "dense" if index < (_field(config, "first_k_dense_replace") or 0) else "moe"
    if selector == "first_layer":
        return "first" if index == 0 else ""
    return ""


def expected_weights(row: object, config: Mapping[str, object], *, count: Mapping[str, int] | None = None
                     ) -> dict[str, tuple[object, ...]] | str:
    """Every parameter name the class builds, with its shape expressions; or why it cannot say."""
    expected: dict[str, tuple[object, ...]] = dict(row.flat)  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
    for container, layers in row.containers.items():  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
        n = count.get(container) if count else None
        if n is None:
            n = _field(config, layers.count) if layers.count else None
        if n is None:
            return f"config.json has no {layers.count or 'layer count'}"
        for index in range(n):
            kind = layers.kinds.get(_layer_kind(layers, index, config)) or next(iter(layers.kinds.values()))
            for name, shape in kind:
                expected[name.replace("{L}", str(index))] = shape
    return expected


def judge(row: object, class_name: str, config: Mapping[str, object],
          tensors: Iterable[tuple[str, tuple[int, ...]]]) -> Loading | str:
    """What loading ``tensors`` (name, shape) into the config's class would do."""
    expected = expected_weights(row, config)
    if isinstance(expected, str):
        return expected
    prefix: str = row.prefix  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
    base_class = class_name == row.base  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
    files = dict(tensors)
    if prefix:
        dotted = prefix + "."
        if base_class:  # the base model: the table's names under the prefix, without it
            expected = {k[len(dotted):]: v for k, v in expected.items() if k.startswith(dotted)}
            files = {k[len(dotted):] if k.startswith(dotted) else k: v for k, v in files.items()}
        elif not any(k.startswith(dotted) for k in files):  # a base model's file loaded by a head class
            heads = {k for k in expected if not k.startswith(dotted)}
            files = {(k if k in heads else dotted + k): v for k, v in files.items()}
    renames = [(re.compile(a), b) for a, b in row.renames]  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
    if renames:
        # one search per name for all the renames: a 200,000-tensor set has almost no name to rename
        any_rename = re.compile("|".join(f"(?:{a})" for a, _ in row.renames), re.M)  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
        if any_rename.search("\n".join(files)) is None:  # one pass in C over every name: the usual answer
            renames = []
        renamed = {}
        for name, shape in files.items() if renames else ():
            if any_rename.search(name):
                for pattern, target in renames:
                    if pattern.search(name):
                        name = pattern.sub(target, name)
            renamed[name] = shape
        if renames:
            files = renamed
    tie = config.get("tie_word_embeddings")
    if not isinstance(tie, bool):
        text = config.get("text_config")
        tie = text.get("tie_word_embeddings") if isinstance(text, dict) else None
    if not isinstance(tie, bool):
        tie = row.tie_default  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
    omittable = set(row.aliases) | (set(row.tied) if tie else set())  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
    if base_class:
        omittable = {k[len(prefix) + 1:] if k.startswith(prefix + ".") else k for k in omittable}
    pieces, loose = _merge_experts(row, files)
    ignore_missing = [re.compile(p) for p in row.ignore_missing]  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
    ignore_unexpected = [re.compile(p) for p in row.ignore_unexpected]  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
    mismatched: list[Mismatch]  # (declared for the type checker: never evaluated)
    missing, missing_experts, mismatched = [], [], []
    cache: dict[tuple[object, ...], tuple[int | None, ...]] = {}
    for name, shape in expected.items():  # type: ignore[assignment]  # expected's values are shape expressions (shape held a stored shape above)
        held = loose.get(name)
        if held is not None:
            want = cache.get(shape)  # per distinct shape (every layer repeats its entries' shapes)
            if want is None:
                want = cache[shape] = tuple(evaluate(e, config) for e in shape)
            if held != want:
                _compare(name, held, shape, config, mismatched)
        elif name in pieces:
            experts = evaluate(shape[0], config) if shape else None
            found = pieces[name]
            need = next(iter(found.values()))[1]  # how many per-expert sources merge into it
            have = {e for (e, _) in found if all((e, i) in found for i in range(need))}
            if experts is not None:
                absent = tuple(e for e in range(experts) if e not in have)
                if absent:
                    missing_experts.append((name, absent, experts))
            for (e, _), (piece_shape, count, dim) in sorted(found.items()):
                piece_want: list[object] = list(shape[1:])  # expressions, then values
                if dim is not None and 0 < dim <= len(piece_want):
                    value = evaluate(piece_want[dim - 1], config)
                    piece_want[dim - 1] = value // count if value is not None else None
                _compare(f"{name}[{e}]", piece_shape, tuple(piece_want), config, mismatched)
        elif name in omittable or any(p.search(name) for p in ignore_missing):
            continue
        else:
            missing.append(name)
    unexpected = []
    for name in loose:
        if name not in expected and not any(p.search(name) for p in ignore_unexpected):
            unexpected.append(name)
    for name, found in pieces.items():
        if name not in expected:
            unexpected.append(name)
            continue
        experts = evaluate(expected[name][0], config) if expected[name] else None
        if experts is not None:
            unexpected.extend(f"{name}[{e}]" for (e, s) in found if e >= experts and s == 0)
    return Loading(class_name, tuple(missing), tuple(missing_experts), tuple(sorted(unexpected)),
                   tuple(mismatched), _extra_layers(row, config, expected, files, unexpected) if unexpected else ())


def _merge_experts(row: object, files: dict[str, tuple[int, ...]]
                   ) -> tuple[dict[str, dict[tuple[int, int], tuple[tuple[int, ...], int, int | None]]],
                              dict[str, tuple[int, ...]]]:
    """The file's per-expert tensors, by the fused parameter they merge into; the rest as they are."""
    converters = []
    for sources, target, dim in row.experts:  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
        for index, source in enumerate(sources):
            pattern = re.compile(re.escape(source).replace(r"\*", r"(\d+)"))
            converters.append((pattern, target, index, len(sources), dim))
    pieces: dict[str, dict[tuple[int, int], tuple[tuple[int, ...], int, int | None]]] = {}
    loose: dict[str, tuple[int, ...]] = {}
    any_source = re.compile("|".join(p.pattern for p, *_ in converters), re.M) if converters else None
    if any_source is not None and any_source.search("\n".join(files)) is None:
        return {}, dict(files)  # no per-expert tensor at all (a fused file): one pass in C
    for name, shape in files.items():
        if any_source is None or not any_source.search(name):
            loose[name] = shape
            continue
        for pattern, target, index, count, dim in converters:
            match = pattern.search(name)
            if match:
                fused = name[:match.start()] + target + name[match.end():]
                pieces.setdefault(fused, {})[(int(match.group(1)), index)] = (shape, count, dim)
                break
        else:
            loose[name] = shape
    return pieces, loose


def _compare(name: str, shape: tuple[int, ...], expressions: tuple[object, ...], config: Mapping[str, object],
             out: list[Mismatch]) -> None:
    values = tuple(evaluate(e, config) for e in expressions)
    if len(values) != len(shape):
        if all(v is not None for v in values):
            out.append(Mismatch(name, tuple(shape), values, tuple(str(e) for e in expressions)))
        return
    if any(v is not None and v != s for v, s in zip(values, shape)):
        fields = tuple("" if e is None or isinstance(e, int) else str(e) for e in expressions)
        out.append(Mismatch(name, tuple(shape), values, fields))


def _extra_layers(row: object, config: Mapping[str, object], expected: Mapping[str, object],
                  files: Mapping[str, object], unexpected: list[str]) -> tuple[tuple[str, str, int], ...]:
    """Containers whose file holds whole layers beyond the config's count, and nothing else unexpected."""
    found = []
    left = set(unexpected)
    for container, layers in row.containers.items():  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
        if not layers.count:
            continue
        pattern = re.compile(re.escape(container) + r"\.(\d+)\.")
        indices = {int(m.group(1)) for name in files if (m := pattern.match(name))}
        n = _field(config, layers.count)
        if not indices or n is None or max(indices) < n or indices != set(range(max(indices) + 1)):
            continue
        more = expected_weights(row, config, count={container: max(indices) + 1})
        if isinstance(more, str) or not all(k in files or k in expected for k in more):
            continue
        left -= {k for k in files if (m := pattern.match(k)) and int(m.group(1)) >= n}
        found.append((container, layers.count, max(indices) + 1))
    return tuple(found) if found and not left else ()


_LAYER = re.compile(r"^(.*?(?:^|\.)(?:layers|layer|h|block|blocks))\.(\d+)\.(.*)$")


def layer_template(name: str) -> tuple[str, int | None]:
    """A name with its layer index as ``{L}``, and the index (None where it names no layer)."""
    match = _LAYER.match(name)
    if match is None:
        return name, None
    return f"{match.group(1)}.{{L}}.{match.group(3)}", int(match.group(2))


def _names_under_prefix(row: object) -> int:
    dotted = row.prefix + "."  # type: ignore[attr-defined]  # a table Row (untyped here: the table is imported lazily)
    flat = sum(name.startswith(dotted) for name, _ in row.flat)  # type: ignore[attr-defined]  # as above
    layered = sum(len(kind) for layers in row.containers.values()  # type: ignore[attr-defined,misc]  # as above; the items are ints (mypy picks sum's overload for bools)
                  for kind in layers.kinds.values())
    return flat + layered
