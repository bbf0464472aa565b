"""What a config's model class would do with a file's tensors: fill, drop, or refuse (by shape).

Pure: names and shapes in, a ``Loading`` out; the table (``guard.inventory.architectures_table``) says
which weights transformers 5 builds for a ``model_type`` and class.  The file's names are first renamed
and merged as transformers does at load (per-expert tensors into the fused parameter), so the
per-expert layout and the fused one are judged alike, and an expert the file lacks is named even
where transformers is silent (it merges the experts it finds and leaves the rest random).
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from operator import itemgetter

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
    """(class name, Row) for config.json, or why there is none (the check does not run).

    Only that model_type's rows are read (``guard.inventory.rows``).  Where config.json sets a field that
    changes the class's modules otherwise than the row was generated for (``Row.flags``), the row is the
    class built from config.json itself (``guard.inventory.build_rows``: a subprocess, cached), or, where
    that cannot be done, why not."""
    from guard.inventory.rows import rows_for

    model_type = config.get("model_type")
    rows = rows_for(model_type) if isinstance(model_type, str) else None
    names = config.get("architectures")
    named = names[0] if isinstance(names, list) and names and isinstance(names[0], str) else None
    if rows is None:
        return _built(config, named, f"model_type {model_type!r} has no row in the table of architectures")
    wanted = named or next(iter(rows))
    row = rows.get(wanted)
    if row is None:
        # The base class itself (BertModel): a head class builds it under its prefix, but some heads leave a part
        # out (BertForMaskedLM has no pooler), so the row with the most names under the prefix is the base's whole.
        bases = [r for r in rows.values() if r.base and r.base == wanted]
        if not bases:
            return _built(config, wanted, f"{wanted} (model_type {model_type!r}) has no row in the table of "
                                          f"architectures")
        row = max(bases, key=_names_under_prefix)
    differs = flags_differ(row, config)
    if differs:
        from guard.inventory.build_rows import built_row

        built = built_row(config, wanted)
        if isinstance(built, str):
            return (f"config.json sets {differs}, which changes the modules {wanted} builds (the table's row is "
                    f"for transformers' default), and {built}")
        return wanted, built
    return wanted, row


_ABSENT = object()


def _built(config: Mapping[str, object], class_name: str | None, why: str) -> tuple[str, object] | str:
    """The class built from config.json where the table has no row for it (a newer type, a class left out), if
    transformers is installed and knows it; else why not."""
    if class_name is None:
        return why
    from guard.inventory.build_rows import built_row

    built = built_row(config, class_name)
    return (class_name, built) if not isinstance(built, str) else f"{why}, and {built}"


def _dotted(config: Mapping[str, object], key: str) -> object:
    head, _, rest = key.partition(".")
    value = config.get(head, _ABSENT)
    if rest:
        return _dotted(value, rest) if isinstance(value, dict) else _ABSENT
    return value


def flags_differ(row: object, config: Mapping[str, object]) -> str:
    """The config fields that change the class's modules and that config.json sets otherwise than the row was
    generated for, spelled for a message ("" where the row vouches for the file's config).  A field config.json
    lacks takes the class's default (the row's); a list of layer kinds agrees where its kinds are the row's."""
    differ = []
    for key, want in row.flags.items():  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
        got = _dotted(config, key)
        if got is _ABSENT or got == want:
            continue
        if want == "<int>" and isinstance(got, int) and not isinstance(got, bool):
            continue  # a size the row's expressions follow; only null builds other modules
        if (isinstance(got, list) and isinstance(want, list) and want
                and all(isinstance(v, str) for v in got) and set(got) <= set(want)):
            continue  # layer_types: the kinds the row's layers were built for
        differ.append(f"{key}={json_text(got)}")
    return ", ".join(differ[:4]) + (f" and {len(differ) - 4} more" if len(differ) > 4 else "")


def json_text(value: object) -> str:
    import json

    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


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
    if selector == "layer_types":  # hybrid models: a layer's kind is the config's layer_types entry
        kinds = _dotted(config, "layer_types")
        if not isinstance(kinds, list):
            text = config.get("text_config")
            kinds = text.get("layer_types") if isinstance(text, dict) else None
        return str(kinds[index]) if isinstance(kinds, list) and index < len(kinds) else ""
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
          tensors: Mapping[str, tuple[int, ...]] | Iterable[tuple[str, tuple[int, ...]]], *,
          tried_whole: bool = False) -> Loading | str:
    """What loading ``tensors`` (name -> shape, or (name, shape) pairs) into the config's class would do.
    ``tried_whole``: the caller found ``whole`` false already (it is not asked again)."""
    files = tensors if isinstance(tensors, dict) else dict(tensors)
    if not tried_whole and whole(row, class_name, config, list(files), list(files.values())):
        return Loading(class_name, (), (), (), (), ())
    expected = expected_weights(row, config)
    if isinstance(expected, str):
        return expected
    prefix: str = row.prefix  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
    base_class = class_name == row.base  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
    if prefix:
        dotted = prefix + "."
        if base_class:  # the base model: the table's names under the prefix, without it
            expected = {k[len(dotted):]: v for k, v in expected.items() if k.startswith(dotted)}
            files = {k[len(dotted):] if k.startswith(dotted) else k: v for k, v in files.items()}
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
    if prefix and not base_class:  # after the renames, as transformers adds the prefix after its renamings (a
        dotted = prefix + "."      # file of older names, llava's language_model.lm_head, is renamed out of it)
        if (not any(k.startswith(dotted) for k in files)  # a base model's file loaded by a head class
                and any(k.startswith(dotted) for k in expected)):  # (T5's head builds nothing under its prefix)
            heads = {k for k in expected if not k.startswith(dotted)}
            files = {(k if k in heads else dotted + k): v for k, v in files.items()}
    omittable = _omittable(row, config)
    if base_class:
        omittable = {k[len(prefix) + 1:] if k.startswith(prefix + ".") else k for k in omittable}
    pieces, loose = _merge_experts(row, files)
    ignore_missing = [re.compile(p) for p in row.ignore_missing]  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
    ignore_unexpected = [re.compile(p) for p in row.ignore_unexpected]  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
    mismatched: list[Mismatch]  # (declared for the type checker: never evaluated)
    missing, missing_experts, mismatched = [], [], []
    cache: dict[tuple[object, ...], tuple[int | None, ...]] = {}
    pieces_seen: dict[tuple[object, ...], list[Mismatch]] = {}
    for name, shape in expected.items():
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
            if {piece[1] for piece in found.values()} == {need}:  # one converter's sources: indices 0..need-1
                have = {e for e, n in Counter(map(itemgetter(0), found)).items() if n == need}
            else:
                have = {e for (e, _) in found if all((e, i) in found for i in range(need))}
            if experts is not None:
                absent = tuple(e for e in range(experts) if e not in have)
                if absent:
                    missing_experts.append((name, absent, experts))
            for (e, _), (piece_shape, count, dim) in sorted(found.items()):
                key = (shape, piece_shape, count, dim)  # an expert's verdict: the same for every expert alike
                verdict = pieces_seen.get(key)
                if verdict is None:
                    piece_want: list[object] = list(shape[1:])  # expressions, then values
                    if dim is not None and 0 < dim <= len(piece_want):
                        value = evaluate(piece_want[dim - 1], config)
                        piece_want[dim - 1] = value // count if value is not None else None
                    verdict = pieces_seen[key] = []
                    _compare("", piece_shape, tuple(piece_want), config, verdict)
                mismatched += [m._replace(tensor=f"{name}[{e}]") for m in verdict]
        elif name in omittable or any(p.search(name) for p in ignore_missing):
            continue
        else:
            missing.append(name)
    unexpected = []
    buffers = {name for name, _ in getattr(row, "buffers", ())}  # non-persistent: loaded when there
    if base_class and prefix:
        buffers = {k[len(prefix) + 1:] if k.startswith(prefix + ".") else k for k in buffers}
    for name in loose:
        if name not in expected and name not in buffers and not any(p.search(name) for p in ignore_unexpected):
            unexpected.append(name)
    for name, found in pieces.items():
        if name not in expected:
            unexpected.append(name)
            continue
        experts = evaluate(expected[name][0], config) if expected[name] else None
        if experts is not None:
            unexpected.extend(f"{name}[{e}]" for (e, s) in found if e >= experts and s == 0)
    built = set(loose) | set(pieces)  # the file's names as the class's: its experts merged
    return Loading(class_name, tuple(missing), tuple(missing_experts), tuple(sorted(unexpected)),
                   tuple(mismatched), _extra_layers(row, config, expected, built, unexpected) if unexpected else ())


def _omittable(row: object, config: Mapping[str, object]) -> set[str]:
    """Names the file may leave out: aliases (written once), and the tied head where the config ties it."""
    key = getattr(row, "tie_key", "tie_word_embeddings")
    tie = _dotted(config, key)  # where transformers reads it for this class (the generator measured it)
    if not isinstance(tie, bool) and key == "tie_word_embeddings":
        text = config.get("text_config")
        tie = text.get("tie_word_embeddings") if isinstance(text, dict) else None
    if not isinstance(tie, bool):
        tie = row.tie_default  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
    return set(row.aliases) | (set(row.tied) if tie else set())  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily


# config fields that pick which layers are which kind (attention or state-space, dense or MoE, cross-attention):
# a row generated from a type's default config, its layers cut to two, holds the kinds those two layers had, and
# follows such a field only where its flags or its layer selector name it
_LAYER_PATTERN = re.compile(
    r"^(?:layer_types|mlp_layer_types|block_types|layers_block_type|attn_layer_(?:period|offset|indices)|"
    r"expert_layer_(?:period|offset)|attention_layers|attn_layers|hybrid_layer_ids|full_attn_idxs|moe_layers|"
    r"moe_layer_(?:freq|interval|start_index|end_index)|interleave_moe_layer_step|(?:de|en)coder_sparse_step|"
    r"mlp_only_layers|first_k_dense_replace|num_dense_layers|cross_attention_layers|cross_attention_frequency|"
    r"global_attn(?:ention)?_every_n_layers|sliding_window_pattern|num_kv_shared_layers|"
    r"num_sparse_(?:de|en)coder_layers)$")
_SELECTED = {"layer_types": "layer_types", "first_k_dense_replace": "first_k_dense_replace"}
_CONSTANT_TIMES = re.compile(r"^\d+\*")
_SAME_WEIGHTS = {"full_attention", "sliding_attention", "chunked_attention", "global", "local", "full", "sliding",
                 "sliding_window", "global_attention", "local_attention", "attention"}


def unvouched(row: object, config: Mapping[str, object], loading: Loading) -> str:
    """Why a table row's findings for this config may be the row's own error, not the file's ("" where the row
    vouches for them): a layer kind the config names that the row was never built with; a field picking which
    layers are which that the row does not follow; a shape the row fitted with a constant where the config may
    set the field it stood for (a default config's ``head_dim``); a row generated from its type's default config
    alone (every type but the data's ``sampled``).  The caller then asks the class itself."""
    if getattr(row, "source", "table") != "table":
        return ""
    selectors = {layers.selector for layers in row.containers.values()}  # type: ignore[attr-defined]  # a table Row
    for layers in row.containers.values():  # type: ignore[attr-defined]  # as above
        if layers.selector == "layer_types":
            kinds = _dotted(config, "layer_types")
            if not isinstance(kinds, list):
                text = config.get("text_config")
                kinds = text.get("layer_types") if isinstance(text, dict) else None
            if not isinstance(kinds, list):
                return "the table's row picks its layers' kinds by layer_types, and config.json has none"
            for kind in kinds:
                if str(kind) not in layers.kinds:
                    return f"config.json's layer_types names {json_text(kind)}, a kind of layer the table's row lacks"
    tracked = {key.rsplit(".", 1)[-1] for key in row.flags}  # type: ignore[attr-defined]  # a table Row
    tracked |= {field for field, selector in _SELECTED.items() if selector in selectors}
    for where in (config, config.get("text_config")):
        for key, value in where.items() if isinstance(where, dict) else ():
            if isinstance(value, list) and all(isinstance(v, str) and v in _SAME_WEIGHTS for v in value):
                continue  # attention over a window or the whole sequence (GPT-Neo's global and local): the same weights
            if _LAYER_PATTERN.match(key) and key not in tracked and value not in (None, [], 0):
                return (f"config.json sets {key}, which picks which layers are which kind, and the table's row "
                        "does not follow it")
    for mismatch in loading.mismatched:
        fitted = [f for f in mismatch.fields if _CONSTANT_TIMES.match(f)]
        if fitted:
            return f"the table's row fitted {fitted[0]} with a constant config.json may set otherwise"
    model_type = config.get("model_type")
    if isinstance(model_type, str):
        from guard.inventory.rows import sampled_types

        if model_type not in sampled_types():
            return (f"the table's row for {model_type} was generated from its default config alone, which may build "
                    "other modules than this config does")
    return ""



def whole(row: object, class_name: str, config: Mapping[str, object], names: Sequence[str],
          shapes: Sequence[tuple[int, ...]], *, in_order: bool = False) -> bool:
    """Whether the file's tensors (``names`` and ``shapes``, in step) are exactly the weights the class builds,
    in one expert layout, each of its shape: then judging finds nothing (the usual answer).  ``in_order``: the
    names are sorted already (the index proof's order, ``guard.inventory.index_proof``), the shapes in step.

    Said in passes that run in C, without the judgement's work per name: the class's names written out in the
    file's sorted order a layer at a time (a layer's names share its prefix, so each layer is one run of the
    order, its names sorted once per kind of layer, an expert's tensors spelled as the per-expert layout names
    them where the file has that layout) and compared with the file's run as text, a layer's text at a time
    (no text of the whole file: 10 MB for 200,000 names, fresh pages for each scan); then each run's shapes as
    one list, the file's own shape objects of a layer kind's first run standing for the next runs' (a reader
    gives equal shapes one object: each comparison is then of identity).  False where it cannot say (a base
    class, an expert count the config lacks, a name of the file's with a line break): the judgement then runs,
    and says the same."""
    if class_name == row.base or row.ignore_missing:  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
        return False
    plan = _plan(row)
    if plan is None or not names or len(names) != len(shapes):
        return False
    ordered = names
    if not in_order:  # the shapes sorted by their names: each one's key is the next name (in C, no index per tensor)
        ordered, shapes = sorted(names), sorted(shapes, key=partial(next, iter(names)))
    values: dict[object, int | None] = {}

    def shape_of(expressions: tuple[object, ...]) -> object:
        """The expected shape, or a stand-in equal to the shapes the judgement accepts (a dimension unchecked)."""
        out = []
        for e in expressions:
            v = values[e] if e in values else values.setdefault(e, evaluate(e, config))
            if v is None:
                return _Accepts(expressions, config)
            out.append(v)
        return tuple(out)

    def held(name: str) -> bool:
        at = bisect_left(ordered, name)
        return at < len(ordered) and ordered[at] == name

    optional = _omittable(row, config)
    groups: list[tuple[str, list[str], list[object]]] = []  # (sort key: a name or a layer's prefix, rests, shapes)
    for name, expressions in row.flat:  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
        if name not in optional or held(name):
            groups.append((name, [""], [shape_of(expressions)]))
    per_expert = None  # which layout the file holds: judged from the first layer with an expert parameter
    for container, layers in row.containers.items():  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
        n = _field(config, layers.count) if layers.count else None
        if n is None:
            return False
        kinds: dict[str, tuple[list[str], list[object]] | None] = {}
        for index in range(n):
            kind = _layer_kind(layers, index, config)
            if kind not in kinds:
                entries = layers.kinds.get(kind) or next(iter(layers.kinds.values()))
                if per_expert is None:
                    per_expert = _layout(plan, entries, held, index)
                kinds[kind] = _block(plan, container, entries, bool(per_expert), shape_of, config)
            block = kinds[kind]
            if block is None:
                return False
            groups.append((f"{container}.{index}.", *block))
    groups.sort(key=itemgetter(0))
    for (key, _, _), (after, _, _) in zip(groups, groups[1:]):
        if key == after or (key.endswith(".") and after.startswith(key)):
            return False  # a name twice, or a name within a layer's run: the order cannot be written out
    at = 0
    for key, rests, group_shapes in groups:
        end = at + len(rests)
        if rests == [""]:  # a name outside the layers
            if end > len(ordered) or ordered[at] != key:
                return False
        # a layer's run as text: equal only if none of the file's names in it holds a line break (the texts'
        # breaks are the same in number), so name for name
        elif "\n".join(ordered[at:end]) != key + f"\n{key}".join(rests):
            return False
        run = shapes[at:end]
        if run != group_shapes:
            return False
        group_shapes[:] = run  # the file's own shape objects, for the kind's next run (the same list per kind)
        at = end
    return at == len(ordered)  # as many names as the class builds


class _Accepts:
    """Equal to the shapes the judgement accepts for a shape with an unchecked dimension (``_compare``)."""

    __slots__ = ("expressions", "config")

    def __init__(self, expressions: tuple[object, ...], config: Mapping[str, object]) -> None:
        self.expressions, self.config = expressions, config

    def __eq__(self, other: object) -> bool:
        return isinstance(other, tuple) and not _mismatched(other, self.expressions, self.config)

    __hash__ = None  # type: ignore[assignment]  # compared, never hashed


def _mismatched(shape: tuple[int, ...], expressions: tuple[object, ...], config: Mapping[str, object]) -> bool:
    found: list[Mismatch] = []
    _compare("", shape, expressions, config, found)
    return bool(found)


_PLANS: dict[int, tuple[object, dict[str, tuple[tuple[str, str, int, int | None], ...]] | None]] = {}


def _plan(row: object) -> dict[str, tuple[tuple[str, str, int, int | None], ...]] | None:
    """Per fused expert parameter of the row (its name's tail), its per-expert sources: (text before the
    expert index, text after, source index, dim); None where the row's renames or per-expert patterns would
    touch a name the class builds (then only the judgement can say what the file's names become).

    Checked once per row on the names of layer 0 and layer 10 (the patterns name no layer digit)."""
    cached = _PLANS.get(id(row))
    if cached is not None and cached[0] is row:
        return cached[1]
    sources: dict[str, tuple[tuple[str, str, int, int | None], ...]] = {}
    for parts, target, dim in row.experts:  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
        sources[target] = tuple((*source.split("*", 1), index, dim) for index, source in enumerate(parts))
    built = [name for name, _ in row.flat]  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
    for layers in row.containers.values():  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
        for entries in layers.kinds.values():
            built += [name.replace("{L}", layer) for name, _ in entries for layer in ("0", "10")]
    renames = [re.compile(a) for a, _ in row.renames]  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
    converters = [(re.compile(re.escape(s).replace(r"\*", r"(\d+)")), t, i) for parts, t, _ in row.experts  # type: ignore[attr-defined]  # as above
                  for i, s in enumerate(parts)]
    plan: dict[str, tuple[tuple[str, str, int, int | None], ...]] | None = sources
    for name in built:
        if any(p.search(name) for p in renames) or any(p.search(name) for p, _, _ in converters):
            plan = None  # a built name the load would rename or merge: judged in full
            break
        target = next((t for t in sources if name.endswith(t)), "")
        for before, after, index, _ in sources.get(target, ()):
            for expert in ("0", "10"):
                piece = name[:len(name) - len(target)] + before + expert + after
                first = next(((p, t, i) for p, t, i in converters if p.search(piece)), None)
                if (first is None or first[1:] != (target, index) or first[0].sub(target, piece, 1) != name
                        or any(p.search(piece) for p in renames)):
                    plan = None  # the per-expert name would be renamed, or not merge back into this parameter
    _PLANS[id(row)] = (row, plan)
    return plan


def _layout(plan: dict[str, tuple[tuple[str, str, int, int | None], ...]], entries: tuple[tuple[str, object], ...],
            held: Callable[[str], bool], index: int) -> bool | None:
    """Whether the file holds the per-expert layout (else the fused one), from the layer's first expert parameter
    (None: the layer has none)."""
    for name, _ in entries:
        target = next((t for t in plan if name.endswith(t)), None)
        if target is not None:
            return not held(name.replace("{L}", str(index)))
    return None


def _block(plan: dict[str, tuple[tuple[str, str, int, int | None], ...]], container: str,
           entries: tuple[tuple[str, object], ...], per_expert: bool, shape_of: Callable[[tuple[object, ...]], object],
           config: Mapping[str, object]) -> tuple[list[str], list[object]] | None:
    """A layer kind's names after the layer's prefix, sorted, and their shapes in step; None where a name does
    not start with the prefix or an expert count cannot be worked out."""
    lead = container + ".{L}."
    named: list[tuple[str, object]] = []
    for name, expressions in entries:
        if not name.startswith(lead) or "{L}" in name[len(lead):]:
            return None
        rest = name[len(lead):]
        target = next((t for t in plan if name.endswith(t)), None) if per_expert else None
        if target is None:
            named.append((rest, shape_of(expressions)))  # type: ignore[arg-type]  # a table entry's shape
            continue
        experts = evaluate(expressions[0], config) if expressions else None  # type: ignore[index]  # a table entry's shape
        if experts is None:
            return None
        pieces = plan[target]
        stem = rest[:len(rest) - len(target)]
        for before, after, _, dim in pieces:
            piece = list(expressions[1:])  # type: ignore[index]  # as above
            if dim is not None and 0 < dim <= len(piece):
                value = evaluate(piece[dim - 1], config)
                piece[dim - 1] = value // len(pieces) if value is not None else None
            want = shape_of(tuple(piece))
            named += [(f"{stem}{before}{e}{after}", want) for e in range(experts)]
    named.sort(key=itemgetter(0))
    return [rest for rest, _ in named], [shape for _, shape in named]


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
    # the text after each source's expert index: a name matches a source only if it holds that text
    tails = [source.split("*", 1)[-1] for sources, _, _ in row.experts for source in sources]  # type: ignore[attr-defined]  # as above
    earlier = [tuple(tails[:k]) for k in range(len(tails))]
    for name, shape in files.items():
        found = any_source.search(name) if any_source is not None else None
        if found is None:
            loose[name] = shape
            continue
        # the search's alternative k is the converter tried first that matches, unless an earlier one matches
        # further on (it would then hold its text): the name is tried in order, as transformers does
        k = found.lastindex - 1  # type: ignore[operator]  # one group per alternative: the matching one's
        if k and any(map(name.__contains__, earlier[k])):
            match = next(filter(None, (c[0].search(name) for c in converters)))
            k = next(j for j, c in enumerate(converters) if c[0].search(name))
        else:
            match = found
        _, target, index, count, dim = converters[k]
        fused = name[:match.start()] + target + name[match.end():]
        pieces.setdefault(fused, {})[(int(match.group(match.lastindex or 1)), index)] = (shape, count, dim)
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
                  built: set[str], unexpected: list[str]) -> tuple[tuple[str, str, int], ...]:
    """Containers whose file holds whole layers beyond the config's count, and nothing else unexpected.

    ``built``: the file's names as the class's (per-expert tensors as the fused parameter they merge into),
    so a per-expert MoE's extra layers count as whole as a fused one's; an unexpected expert beyond the
    config's expert count (``name[e]``) is not a layer's."""
    found = []
    left = set(unexpected)
    for container, layers in row.containers.items():  # type: ignore[attr-defined]  # a table Row, typed object: the table is imported lazily
        if not layers.count:
            continue
        pattern = re.compile(re.escape(container) + r"\.(\d+)\.")
        indices = {int(m.group(1)) for name in built if (m := pattern.match(name))}
        n = _field(config, layers.count)
        if not indices or n is None or max(indices) < n or indices != set(range(max(indices) + 1)):
            continue
        more = expected_weights(row, config, count={container: max(indices) + 1})
        if isinstance(more, str) or not all(k in built or k in expected for k in more):
            continue
        left -= {k for k in left if (m := pattern.match(k)) and int(m.group(1)) >= n and "[" not in k}
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
