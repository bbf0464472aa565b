"""CG123-CG127: what loading will do, judged against the weights the config's class builds.

transformers fills a parameter no tensor names at random and only logs it, drops a tensor with no
place and only logs it, and refuses a shape the config contradicts (experts missing from a per-expert
file among them: it merges the experts it finds into a fused parameter too short).  Each message says
what transformers 5.25 does, as measured (tests/test_loading_rules.py runs it on the planted files).
The table (``guard.inventory.architectures_table``) says what the class builds;
``guard.inventory.architectures`` judges the file's names and shapes against it.

Judged: the primary weight set of a transformers model (config.json with a ``model_type``, the hf
layout, safetensors or a torch pickle, not quantized: packed shapes are not the logical ones).  A
model_type or class without a row is a note (CG127) where config.json names its class
(``architectures``, which save_pretrained always writes), never a silent pass; a hand-written config
that names none is left alone.  CG126 (fp32 keeps stored narrower) reads the keep-fp32 table and
judges every set the dtype rules judge, a training checkpoint's masters included.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import chain, compress

from guard.catalogue import make_finding
from guard.config import Policy, match_flags
from guard.dtypes import display_name as dn
from guard.findings import Finding, shown
from guard.fixes import Fix, make_fix
from guard.inventory import ModelInventory, WeightSet
from guard.inventory.sets import BY_NAME
from guard.tensors import TENSOR_FILE, TENSOR_NAME, TENSOR_SHAPE, column

_FORMATS = ("safetensors", "torch")
_HALVES = ("BF16", "F16")
_UNREAD = ("CG001", "CG002")  # the file itself unreadable, or an LFS pointer
NARROWED = "transformers keeps these in fp32; the precision was lost when the checkpoint was saved"


def applies(inventory: ModelInventory) -> bool:
    """config.json names a model_type and its class (``architectures``: what save_pretrained writes, and a
    hand-written config lacks); a bare weight file, the hook's usual commit, imports nothing."""
    config = inventory.config
    return (isinstance(config, dict) and isinstance(config.get("model_type"), str)
            and isinstance(config.get("architectures"), list) and not inventory.is_diffusers)


def loaded_set(inventory: ModelInventory) -> WeightSet | None:
    """The set transformers' from_pretrained loads: the primary hf-layout weights, unquantized."""
    ws = inventory.primary
    if ws is None or ws.role != "weights" or ws.layout != "hf" or ws.format not in _FORMATS:
        return None
    if not ws.has_tensors or inventory.quantization(ws) is not None:
        return None
    if any(scan.format is None or any(f.code in _UNREAD for f in scan.findings) for scan in ws.files):
        # a file that could not be read is already its error (CG001, CG002): its tensors are unknown, not
        # missing, and judging the rest would name every one of them as filled at random
        return None
    return ws


def check_filled_at_random(inventory: ModelInventory, policy: Policy) -> list[Finding]:
    return [f for f in _judged(inventory) if f.code == "CG123"]


def check_dropped(inventory: ModelInventory, policy: Policy) -> list[Finding]:
    return [f for f in _judged(inventory) if f.code == "CG124"]


def check_shapes(inventory: ModelInventory, policy: Policy) -> list[Finding]:
    return [f for f in _judged(inventory) if f.code == "CG125"]


def check_not_checked(inventory: ModelInventory, policy: Policy) -> list[Finding]:
    return [f for f in _judged(inventory) if f.code == "CG127"]


def _judged(inventory: ModelInventory) -> list[Finding]:
    """The four codes' findings, judged once per set (each code is its own check, for --select)."""
    ws = loaded_set(inventory) if applies(inventory) else None
    if ws is None:
        return []
    found = ws.memo.get("loading")
    if found is None:
        found = ws.memo["loading"] = list(loading_findings(inventory, ws))
    return found


def loading_findings(inventory: ModelInventory, ws: WeightSet) -> Iterator[Finding]:
    """CG123, CG124, CG125 and CG127 for the set from_pretrained loads."""
    config = inventory.config
    if not isinstance(config, dict):
        return
    # names and shapes in step, read from the columns in C (the shapes are the readers' tuples); which file
    # holds a name is worked out only where a finding names it.  A sharded set's proven index sorted the
    # names already (guard.inventory.index_proof): its order is taken, not worked out again.
    shapes = list(chain.from_iterable(column(TENSOR_SHAPE, scan.tensors) for scan in ws.files))
    by_name = ws.memo.pop(BY_NAME, None)
    if by_name is not None:
        names, order = by_name
        tensors = (names, list(map(shapes.__getitem__, order)))
    else:
        tensors = (list(chain.from_iterable(column(TENSOR_NAME, scan.tensors) for scan in ws.files)), shapes)
    for finding in judged_tensors(config, tensors, path=ws.files[0].path, file_of=_file_of(ws),
                                  config_path=inventory.config_path, inventory=inventory,
                                  in_order=by_name is not None):
        yield finding._replace(set=ws.name)


def _file_of(ws: WeightSet) -> Callable[[str], str | None]:
    """Which of the set's files holds a tensor: the map built on the first lookup (a finding's), not per scan."""
    paths: dict[str, str] = {}

    def file_of(name: str) -> str | None:
        if not paths:
            for scan in ws.files:
                paths.update(dict.fromkeys(column(TENSOR_NAME, scan.tensors), scan.path))
        return paths.get(name)
    return file_of


def judged_tensors(config: dict[str, object],
                   tensors: tuple[list[str], list[tuple[int, ...]]] | list[tuple[str, tuple[int, ...]]], *, path: str,
                   file_of: Callable[[str], str | None] | None = None, config_path: str | None = None,
                   inventory: ModelInventory | None = None, in_order: bool = False) -> Iterator[Finding]:
    """The loading findings for names and shapes the config's class would load (a list of names and one of
    shapes in step, or (name, shape) pairs): a scanned set's, or what a consolidation is about to publish
    (``guard.convert.run``).  ``inventory``: the scanned model, whose config.json text CG124's fix rewrites
    (none without it).  ``in_order``: the names are sorted already, the shapes in step."""
    from guard.inventory.architectures import judge, layer_template, table_row, unvouched, whole

    found = table_row(config)
    if isinstance(found, str):
        yield _not_checked(config_path or path, found)
        return
    class_name, row = found
    names, shapes = tensors if isinstance(tensors, tuple) else ([n for n, _ in tensors], [s for _, s in tensors])
    if whole(row, class_name, config, names, shapes, in_order=in_order):
        return  # the weights the class builds, each of its shape: nothing to judge
    mapped = dict(zip(names, shapes))
    loading = judge(row, class_name, config, mapped, tried_whole=True)
    if isinstance(loading, str):
        yield _not_checked(config_path or path, loading)
        return
    doubt = unvouched(row, config, loading) if _any(loading) else ""
    if doubt:  # the row may be wrong for this config, not the file: the class built from config.json answers
        from guard.inventory.build_rows import built_row

        row = built_row(config, class_name)
        if isinstance(row, str):
            yield _not_checked(config_path or path, f"{doubt}, and {row}")
            return
        if whole(row, class_name, config, names, shapes, in_order=in_order):
            return
        loading = judge(row, class_name, config, mapped, tried_whole=True)
        if isinstance(loading, str):
            yield _not_checked(config_path or path, loading)
            return
    missing = loading.missing
    if missing:
        towers, missing = _towers(row, config, missing)
        for prefix, key, count in towers:
            yield make_finding(
                "CG123", path,
                f"the {_tower(key)} would be random: config.json declares {key}, and the file holds no tensor for "
                f"{class_name}'s {count} parameter(s) under {shown(prefix + '.')} (transformers fills each at random "
                "and only logs it)",
                tensor=prefix,
            )._replace(fix=_no_fix(class_name))
    drifted: list[tuple[str, str, str]] = []  # (the name the class fills, the file's name it drops, as renamed)
    if missing and loading.unexpected:
        drifted = _drifted(row, config, missing, loading.unexpected, mapped)
        if drifted:
            paired = {fill for fill, _, _ in drifted}
            missing = tuple(n for n in missing if n not in paired)
    for fills, drops in _pair_groups(drifted):
        yield make_finding(
            "CG123", path,
            f"{class_name} would fill {fills} at random and drop {drops}, of the same shape: the name drifted "
            "(transformers maps no rename between them, and reports the one missing and the other unexpected)",
            tensor=drifted[0][0],
        )._replace(fix=_no_fix(class_name))
    for template, layers in _grouped(missing):
        head = _head(row, config, template) if not layers else None
        yield make_finding(
            "CG123", path,
            f"{class_name} would fill {_spelled(template, layers)} at random: no tensor in the file holds "
            f"{'it' if not layers or len(layers) == 1 else 'them'}" + (f" ({head})" if head else ""),
            tensor=template.replace("{L}", str(layers[0]) if layers else "0"),
        )._replace(fix=_no_fix(class_name))
    strays = _stray_experts(loading)
    reslotted: set[str] = set()  # experts past the count that transformers loads into absent ones' slots
    groups: dict[tuple[str, tuple[int, ...], int, tuple[int, ...]], list[int]] = {}
    for name, experts, of in loading.missing_experts:
        past = strays.get(name, ())
        if of - len(experts) + len(past) == of:
            reslotted.update(f"{name}[{e}]" for e in past)
        template, layer = layer_template(name)
        groups.setdefault((template, experts, of, past), []).extend(() if layer is None else (layer,))
    for (template, experts, of, beyond), layers in groups.items():
        plural = "s" if len(set(layers)) > 1 else ""
        yield make_finding(
            "CG123", path,
            f"the file holds no tensor for experts {_ranges(experts)} of {of}"
            f"{f' in layer{plural} ' + _ranges(layers) if layers else ''} ({template}): "
            + _merged(class_name, of, len(experts), beyond),
            tensor=template.replace("{L}", str(layers[0]) if layers else "0"),
        )._replace(fix=_no_fix(class_name))
    if reslotted:
        loading = loading._replace(unexpected=tuple(n for n in loading.unexpected if n not in reslotted))
    if drifted:
        renamed = {as_renamed for _, _, as_renamed in drifted}
        loading = loading._replace(unexpected=tuple(n for n in loading.unexpected if n not in renamed))
        for fills, drops in _pair_groups(drifted):
            yield make_finding(
                "CG124", (file_of and file_of(drifted[0][1])) or path,
                f"{class_name} would drop {drops}: its name drifted from {fills}, which it would fill at random "
                "instead (CG123)",
                tensor=drifted[0][1],
            )._replace(fix=_DROPPED_NO_FIX)
    if loading.unexpected:
        shown_names = [(t, ls) for t, ls in _grouped(loading.unexpected)]
        first = loading.unexpected[0]
        extra = "; ".join(f"{container}: {count} layers in the file, config.json {field} says fewer"
                          for container, field, count in loading.extra_layers)
        yield make_finding(
            "CG124", (file_of and file_of(first)) or path,
            f"{class_name} would drop {len(loading.unexpected)} tensor(s) with no place in it: "
            + ", ".join(_spelled(t, ls) for t, ls in shown_names[:6])
            + (f" and {len(shown_names) - 6} more group(s)" if len(shown_names) > 6 else "")
            + (f" ({extra})" if extra else ""),
            tensor=first,
        )._replace(fix=_layers_fix(loading, row, config, mapped, inventory) if loading.extra_layers
                   else _DROPPED_NO_FIX)
    for mismatch in loading.mismatched:
        name = mismatch.tensor.split("[", 1)[0]
        reasons = [f"dimension {i} is {got} where " + (f"config.json's {field} gives {want}" if field else
                                                        f"the class built from config.json has {want}")
                   for i, (got, want, field) in enumerate(zip(mismatch.shape, mismatch.expected, mismatch.fields))
                   if want is not None and got != want]
        if not reasons:
            reasons = [f"{len(mismatch.shape)} dimensions where the class builds {len(mismatch.expected)}"]
        yield make_finding(
            "CG125", (file_of and file_of(name)) or path,
            f"{shown(mismatch.tensor)} has shape {list(mismatch.shape)}: {'; '.join(reasons)} "
            f"({class_name} refuses to load it)",
            tensor=name,
        )


def _any(loading: object) -> bool:
    return bool(loading.missing or loading.missing_experts or loading.unexpected  # type: ignore[attr-defined]  # a Loading record
                or loading.mismatched)  # type: ignore[attr-defined]  # as above


_TOWERS = {"vision_config": "vision tower", "audio_config": "audio tower", "speech_config": "speech encoder",
           "visual_config": "vision tower", "image_config": "image encoder", "video_config": "video encoder"}


def _tower(key: str) -> str:
    return _TOWERS.get(key) or f"{key.removesuffix('_config')} sub-model"


def _towers(row: object, config: dict[str, object], missing: tuple[str, ...]
            ) -> tuple[list[tuple[str, str, int]], tuple[str, ...]]:
    """The row's sub-models (``Row.sub_models``: prefix, config key) that config.json declares and of which the
    file holds nothing: every parameter under the prefix missing (a text-only conversion that stripped the vision
    tower and kept vision_config); and the missing names left once theirs are taken out.  The text model is not
    one: its absence is every layer's finding, said as such."""
    from guard.inventory.architectures import expected_weights

    subs = [(p, k) for p, k in getattr(row, "sub_models", ()) if k != "text_config" and isinstance(config.get(k), dict)]
    if not subs:
        return [], missing
    expected = expected_weights(row, config)
    if isinstance(expected, str):
        return [], missing
    absent = set(missing)
    found = []
    for prefix, key in subs:
        under = [n for n in expected if n.startswith(prefix + ".")]
        if under and all(n in absent for n in under):
            found.append((prefix, key, len(under)))
            absent.difference_update(under)
    return found, tuple(n for n in missing if n in absent)


def _head(row: object, config: dict[str, object], name: str) -> str | None:
    """Why a missing output head is not tied to the input embeddings, as transformers 5.25 resolves the tie
    (config.json's top-level ``tie_word_embeddings``, else the text config's, else the class's default): said
    where the missing name is the row's tied head and the tie resolves false."""
    tied = set(getattr(row, "tied", ())) | set(getattr(row, "aliases", ()))
    if name not in tied and not name.endswith(("lm_head.weight", "embed_out.weight", "output.weight")):
        return None
    where, value = _tie(row, config)
    if value:
        return None
    return (f"the output head: {where} is false, so transformers does not tie it to the input embeddings and "
            "the model generates from a random head")


def _tie(row: object, config: dict[str, object]) -> tuple[str, object]:
    key = getattr(row, "tie_key", "tie_word_embeddings") or "tie_word_embeddings"
    for path in (key, "tie_word_embeddings", "text_config.tie_word_embeddings", "decoder.tie_word_embeddings"):
        value = _at(config, tuple(path.split(".")))
        if isinstance(value, bool):
            return f"config.json's {path}", value
    return f"{type(row).__name__}'s default tie_word_embeddings", getattr(row, "tie_default", False)


def _drifted(row: object, config: dict[str, object], missing: tuple[str, ...], unexpected: tuple[str, ...],
             tensors: dict[str, tuple[int, ...]]) -> list[tuple[str, str, str]]:
    """Pairs of a parameter no tensor fills and a tensor with no place, one name of the other drifted: the same
    components but one, that one a spelling of the other (``embedding``/``embeddings``), the same layer, the
    same shape.  (the class's name, the file's name, the file's name as transformers renamed it)."""
    import difflib

    from guard.inventory.architectures import evaluate, expected_weights

    expected = expected_weights(row, config)
    if isinstance(expected, str) or len(missing) * len(unexpected) > 250_000:
        return []
    files = _as_renamed(row, [n for n in tensors if n not in expected])
    pairs = []
    taken: set[str] = set()
    for fill in missing:
        want = tuple(evaluate(e, config) for e in expected.get(fill, ()))
        parts = fill.split(".")
        for drop in unexpected:
            original = files.get(drop, drop)
            if drop in taken or original not in tensors:
                continue
            other = drop.split(".")
            if len(other) != len(parts) or tensors[original] != want:
                continue
            differ = [(a, b) for a, b in zip(parts, other) if a != b]
            if len(differ) != 1:
                continue
            a, b = differ[0]
            if a.isdigit() or b.isdigit() or difflib.SequenceMatcher(None, a, b).ratio() < 0.75:
                continue
            pairs.append((fill, original, drop))
            taken.add(drop)
            break
    return pairs


def _as_renamed(row: object, names: list[str]) -> dict[str, str]:
    """The file's names as transformers renames them at load (``Row.renames``), back to the file's own."""
    import re

    renames = [(re.compile(a), b) for a, b in getattr(row, "renames", ())]
    out = {}
    for name in names:
        renamed = name
        for pattern, target in renames:
            if pattern.search(renamed):
                renamed = pattern.sub(target, renamed)
        out[renamed] = name
    return out


def _pair_groups(pairs: list[tuple[str, str, str]]) -> list[tuple[str, str]]:
    """The drifted pairs, spelled a layer-less template at a time: (what is filled, what is dropped)."""
    from guard.inventory.architectures import layer_template

    groups: dict[tuple[str, str], list[int]] = {}
    for fill, drop, _ in pairs:
        (t_fill, layer), (t_drop, _) = layer_template(fill), layer_template(drop)
        groups.setdefault((t_fill, t_drop), []).extend(() if layer is None else (layer,))
    return [(_spelled(a, layers), _spelled(b, layers)) for (a, b), layers in groups.items()]


def _merged(class_name: str, of: int, absent: int, extra: tuple[int, ...]) -> str:
    """What transformers 5.25 does with a per-expert file lacking experts, as measured (tests/test_loading_rules.py):
    it merges the experts it finds, in index order, into the fused parameter; fewer than the config's count give a
    tensor too short, which it refuses; as many (experts numbered past the count standing in for the absent ones)
    load silently, each in the next slot."""
    found = of - absent + len(extra)
    if found == of:
        return (f"transformers merges the {of} experts it finds in index order and reports nothing: expert"
                f"{'s' if len(extra) > 1 else ''} {_ranges(extra)} (beyond config.json's {of}) load into the absent "
                f"expert{'s' if absent > 1 else ''}' slot{'s' if absent > 1 else ''}")
    if found < of:
        return (f"transformers merges the {found} experts it finds into a tensor for {found} where {class_name} "
                f"builds {of}, and refuses it (RuntimeError, size mismatch; with ignore_mismatched_sizes=True every "
                f"expert of the parameter starts random)")
    return f"transformers merges the {found} experts it finds where {class_name} builds {of}, and refuses the size"


def _stray_experts(loading: object) -> dict[str, tuple[int, ...]]:
    """Experts the file numbers past the config's count, by the fused parameter they merge into (``name[e]``)."""
    out: dict[str, list[int]] = {}
    for name in loading.unexpected:  # type: ignore[attr-defined]  # a Loading record, typed object here
        fused, bracket, index = name[:-1].rpartition("[") if name.endswith("]") else ("", "", "")
        if bracket and index.isdigit():
            out.setdefault(fused, []).append(int(index))
    return {k: tuple(sorted(v)) for k, v in out.items()}


def consolidation_findings(config: dict[str, object], tensors: list[tuple[str, tuple[int, ...]]], *,
                           out: str) -> list[Finding]:
    """What loading will do with a consolidated training checkpoint, judged before ``convert`` publishes it:
    an expert-parallel save that never gathered every expert is refused (CG123), not published."""
    import os

    if not isinstance(config.get("model_type"), str) or not isinstance(config.get("architectures"), list):
        return []  # as for a scan: a config that names no class is not judged
    return list(judged_tensors(config, tensors, path=os.path.join(out, "model.safetensors")))


def _not_checked(path: str, why: str) -> Finding:
    return make_finding("CG127", path, f"what loading will do was not checked: {why}")


def _no_fix(class_name: str) -> Fix:
    return Fix("", "no mechanical fix: the weights are not in this checkpoint. Take them from the run or the "
                   f"checkpoint that was saved (every rank's or expert-parallel shard's file, the untied head), "
                   f"or load {class_name} knowing they start random", "none")


_DROPPED_NO_FIX = Fix("", "no mechanical fix: these tensors were not found to be whole layers beyond config.json's "
                          "count (layers 0..M-1, each complete), the one case a config change repairs; check which "
                          "is right, the checkpoint's architecture or its config, or load it knowing transformers "
                          "drops them", "none")


def _layers_fix(loading: object, row: object, config: dict[str, object],
                tensors: dict[str, tuple[int, ...]], inventory: ModelInventory | None) -> Fix:
    """CG124 where the file holds whole layers the config does not count: config.json's count set to the
    file's, an unsafe fix (``--unsafe-fixes``): which is right, the config or the weights, only the user knows.

    Offered only where the file's layers are 0..M-1, each complete, and the config with the new count would
    load every tensor, with nothing random, dropped or refused (judged again here); otherwise shown only."""
    extra = loading.extra_layers  # type: ignore[attr-defined]  # a Loading record, typed object here
    wanted = ", ".join(f"{field}: {count}" for _, field, count in extra)
    planned = _count_edits(loading, row, config, tensors, inventory)
    if isinstance(planned, str):
        return Fix("", f"the file holds whole layers the config does not count: setting {wanted} in config.json "
                       f"would load them, but no fix is planned ({planned}); check which is right, the config or "
                       "the weights", "none")
    from guard.rules.dtype_fixes import relative

    assert inventory is not None and inventory.config_path is not None  # _count_edits returned edits
    name = relative(inventory.path, inventory.config_path)
    return make_fix(
        "config-field", f"set {wanted} in config.json: the file holds that many whole layers, each complete "
                        "(unsafe: check which is right, the config or the weights; the config may have been cut "
                        "on purpose)",
        safety="unsafe", flag="--unsafe-fixes", writes=(inventory.config_path,),
        dir=inventory.path, file=name, reads=[name], value=wanted, edits=planned)


def _count_edits(loading: object, row: object, config: dict[str, object],
                 tensors: dict[str, tuple[int, ...]],
                 inventory: ModelInventory | None) -> list[dict[str, object]] | str:
    """config.json's byte spans of each count field, with the file's count; or why none is planned."""
    import json

    from guard.inventory.architectures import judge
    from guard.jsonspan import JsonSpanError, find_values

    if inventory is None or inventory.config_path is None or not inventory.config_text:
        return "there is no config.json text to rewrite"
    edits: list[dict[str, object]] = []
    changed: dict[str, object] = config
    for _, field, count in loading.extra_layers:  # type: ignore[attr-defined]  # a Loading record, typed object here
        path = _field_path(config, field)
        if path is None:
            return f"config.json holds no integer {field}"
        types_path = path[:-1] + ("layer_types",)
        types = _at(config, types_path)
        try:
            spans = find_values(inventory.config_text, path)
            if isinstance(types, list) and len(types) != count:  # a list of the layers' kinds: as long as the count
                if any(edit["path"] == list(types_path) for edit in edits):
                    return f"two counts share {'.'.join(types_path)}"
                edit = _layer_types_edit(inventory.config_text, types_path, types, count)
                if isinstance(edit, str):
                    return edit
                edits.append(edit)
                changed = _with(changed, types_path, json.loads(str(edit["value"])))
        except JsonSpanError:
            return "its text cannot be walked"
        was = _at(config, path)
        if not spans or json.loads(spans[-1].token) != was:
            return "its text and its parsed values disagree"
        edits.extend({**span.to_json(), "new": str(count), "key": ".".join(path), "path": list(path), "was": was}
                     for span in spans)
        changed = _with(changed, path, count)
    again = judge(row, loading.class_name, changed, tensors)  # type: ignore[attr-defined]  # a Loading record, typed object here
    if isinstance(again, str) or again.missing or again.missing_experts or again.unexpected or again.mismatched:
        return "with the file's count, loading would still fill, drop or refuse tensors: the layers are not whole"
    return sorted(edits, key=lambda edit: int(edit["offset"]))  # type: ignore[call-overload]  # each edit's offset is an int


def _layer_types_edit(text: str, path: tuple[str, ...], types: list[object], count: int) -> dict[str, object] | str:
    """config.json's ``layer_types`` made ``count`` long: cut to the file's layers, or continued where the list
    is one kind repeated, or a pattern seen whole at least twice (Gemma's five sliding layers and a full one);
    else why the kinds of the added layers are not mechanical.  One edit: the list's last entry with the
    entries added after it (as the list separates its entries), or the entries past ``count`` taken out."""
    import json

    from guard.jsonspan import find_values, span_of

    key = ".".join(path)
    if not types or not all(isinstance(t, str) for t in types):
        return f"{key} is not a list of names"
    if count > len(types):
        period = next(p for p in range(1, len(types) + 1)
                      if all(t == types[i % p] for i, t in enumerate(types)))
        if 2 * period > len(types):  # a kind seen once is no pattern yet
            return (f"{key} does not repeat one kind or a pattern seen twice: which kind layers {len(types)}.."
                    f"{count - 1} are is not mechanical; set it and the count by hand")
        value = types + [types[i % period] for i in range(len(types), count)]
    else:
        value = types[:count]
    at = {i: find_values(text, (*path, i)) for i in {0, 1, count - 1, len(types) - 1} if i < len(types)}
    if any(len(found) != 1 or json.loads(found[0].token) != types[i] for i, found in at.items()):
        return f"{key} is written more than once, or its text and its parsed values disagree"
    first, last = at[0][0], at[len(types) - 1][0]
    if len(types) > 1:
        separator = text[first.end:at[1][0].start]
    else:  # one entry: as json.dumps(indent=N) separates them, where the entry starts a line
        lead = text[text.rfind("\n", 0, first.start) + 1:first.start]
        separator = ",\n" + lead if not lead.strip() else ", "
    if separator.strip() != ",":
        return f"{key}'s text separates its entries with more than a comma"
    if count > len(types):
        start, old = last, last.token
        new = last.token + "".join(separator + json.dumps(t) for t in value[len(types):])
    else:
        start = span_of(text, at[count - 1][0].end, last.end)
        old, new = start.token, ""
    return {**start.to_json(), "old": old, "new": new, "key": key, "path": list(path), "was": types,
            "value": json.dumps(value)}


def _field_path(config: dict[str, object], field: str) -> tuple[str, ...] | None:
    """Where config.json holds a count field, as the table reads it (a text_config's where the top lacks it)."""
    path = tuple(field.split("."))
    if not _is_count(_at(config, path)) and len(path) == 1 and isinstance(config.get("text_config"), dict):
        path = ("text_config", field)
    return path if _is_count(_at(config, path)) else None


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _at(obj: object, path: tuple[str, ...]) -> object:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _with(obj: dict[str, object], path: tuple[str, ...], value: object) -> dict[str, object]:
    """A copy of ``obj`` with ``path`` set (the dicts on the way copied; the parsed config is not changed)."""
    inner = obj.get(path[0])
    return {**obj, path[0]: value if len(path) == 1 else _with(inner if isinstance(inner, dict) else {}, path[1:],
                                                               value)}


def _grouped(names: tuple[str, ...]) -> list[tuple[str, list[int]]]:
    """Names with their layer index taken out: template -> layers, in first-seen order."""
    from guard.inventory.architectures import layer_template

    groups: dict[str, list[int]] = {}
    for name in names:
        template, layer = layer_template(name)
        groups.setdefault(template, [])
        if layer is not None:
            groups[template].append(layer)
    return list(groups.items())


def _spelled(template: str, layers: list[int]) -> str:
    if not layers:
        return shown(template)
    return f"{shown(template.replace('{L}', 'N'))} (layer{'s' if len(layers) > 1 else ''} {_ranges(layers)})"


def _ranges(values: object) -> str:
    """0, 1, 2, 5 -> '0–2, 5'."""
    ordered = sorted(set(values))  # type: ignore[call-overload]  # layer indices: ints
    parts: list[str] = []
    start = prev = ordered[0]
    for value in ordered[1:] + [None]:
        if value is not None and value == prev + 1:
            prev = value
            continue
        parts.append(str(start) if start == prev else f"{start}–{prev}")
        if value is not None:
            start = prev = value
    return ", ".join(parts)


def check_narrowed_keeps(inventory: ModelInventory, policy: Policy) -> Iterator[Finding]:
    """CG126: tensors transformers keeps in fp32 (``guard.inventory.keep_fp32``) stored in bf16 or fp16."""
    from guard.inventory.keep_fp32 import KEEP_IN_FP32, TRANSFORMERS_VERSION, component_globs

    config = inventory.config
    keeps = KEEP_IN_FP32.get(config.get("model_type")) if applies(inventory) else None  # type: ignore[union-attr,arg-type]  # applies(inventory) holds only with a config dict; model_type may be absent (get(None) is None)
    if keeps is None:
        return
    declared = {item.value for item in inventory.config_dtypes()}
    for ws in inventory.sets:
        if not ws.judged or inventory.quantization(ws) is not None:
            continue
        groups = ws.by_dtype()
        for code in _HALVES:
            tensors = groups.get(code)
            if not tensors:
                continue
            entries = keeps.strict + (keeps.fp16 if code == "F16" and "float16" in declared else ())
            if not entries:
                continue
            names = list(column(TENSOR_NAME, tensors))
            flags = match_flags(component_globs(entries), names)
            if not any(flags):
                continue
            kept = list(compress(names, flags))
            files = sorted(set(compress(column(TENSOR_FILE, tensors), flags)))
            yield make_finding(
                "CG126", files[0],
                f"{len(kept)} tensor(s) that transformers keeps in fp32 for model_type "
                f"{config.get('model_type')!r} (the keep-fp32 table of transformers {TRANSFORMERS_VERSION}) are "  # type: ignore[union-attr]  # config is a dict here: applies(inventory) held above
                f"stored in {dn(code)}: {', '.join(shown(n) for n in kept[:4])}"
                f"{f' and {len(kept) - 4} more' if len(kept) > 4 else ''}. {NARROWED}",
                tensor=kept[0],
            )._replace(set=ws.name, fix=Fix(
                "", "no mechanical fix: widening them back to fp32 does not bring the precision back; save "
                    "them again from the fp32 weights (the training run's masters)", "none"))
