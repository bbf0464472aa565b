"""config-dtype (CG103) and config-field (CG124): config.json with planned values rewritten, every other
byte as it was.  config-dtype rewrites the dtype keys; config-field one integer field (the layer count of a
file that holds more whole layers than the config says; with it, where the config lists each layer's kind,
its ``layer_types`` made as long), an unsafe fix that only ``--unsafe-fixes`` applies.

The scan planned the edits as byte spans of the file it read.  Here the file is read again;
each span must still hold the text the plan saw, or the file changed since the scan and the
fix is refused.  What is staged is verified before ``guard.fix.apply`` may publish it: it
parses, each key path holds the new value, and the parsed document equals the old one with
those values replaced (so no other value moved).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from guard import jsonload
from guard.catalogue import make_finding
from guard.errors import GuardError
from guard.fix.context import ActionContext, Staged
from guard.fixes import Fix
from guard.inventory.model import MAX_JSON_BYTES
from guard.jsonspan import JsonSpanError, find_values


class StaleConfig(GuardError):
    """The file is not the one the scan planned against: nothing is written."""


def stage_config_dtype(fix: Fix, ctx: ActionContext) -> Staged:
    args = fix.arguments
    name = str(args.get("file", "config.json"))
    edits = sorted(args.get("edits") or [], key=lambda e: int(e["offset"]))
    source = ctx.final(name)
    shown = fix.writes[0] if fix.writes else name
    old = _read(source, shown)
    new = rewrite(old, edits, shown=shown)
    staged = ctx.staging / name
    staged.parent.mkdir(parents=True, exist_ok=True)
    staged.write_bytes(new)
    problems = verify_rewrite(old, new, edits)
    findings = [make_finding("CG301", shown, f"the rewritten config.json did not verify: {p}") for p in problems]
    keys = ", ".join(sorted({str(e["key"]) for e in edits}))
    summary = f"{shown}: {keys} -> {args.get('value')} ({len(edits)} value(s) rewritten, {len(new):,} bytes)"
    return Staged(files=[(staged, source)], findings=findings, summary=summary,
                  details={"edits": [dict(e) for e in edits]})


def stage_config_field(fix: Fix, ctx: ActionContext) -> Staged:
    """The planned integer fields rewritten, staged and verified exactly as a dtype rewrite is."""
    staged = stage_config_dtype(fix, ctx)
    edits = staged.details.get("edits") or []
    for edit in edits:  # the plan's new values are integers (a count) or a list of names (layer_types, whole in
        # "value"): a span that would hold anything else is refused
        if not (str(edit.get("new", "")).isdigit() or _names(edit.get("value"))):
            raise StaleConfig(f"{edit.get('key')}: {edit.get('new')!r} is not a count; nothing written")
    shown = fix.writes[0] if fix.writes else str(fix.arguments.get("file", "config.json"))
    changes = ", ".join(f"{e['key']}: {e['old']} -> {e['new']}" if "value" not in e else
                        f"{e['key']}: {len(e['was'])} -> {len(json.loads(e['value']))} entries" for e in edits)
    size = staged.files[0][0].stat().st_size if staged.files else 0
    return Staged(files=staged.files, findings=staged.findings,
                  summary=f"{shown}: {changes} ({len(edits)} value(s) rewritten, {size:,} bytes)",
                  details=staged.details)


def _names(value: object) -> bool:
    """A list edit's whole new value: a JSON list of strings."""
    try:
        parsed = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return False
    return isinstance(parsed, list) and all(isinstance(item, str) for item in parsed)


def _read(path: object, shown: str) -> bytes:
    try:
        with open(path, "rb") as fh:  # type: ignore[call-overload]  # path is the fix's config path, a str
            data: bytes = fh.read(MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise StaleConfig(f"{shown}: cannot read it again ({exc.strerror}); nothing written") from None
    if len(data) > MAX_JSON_BYTES:
        raise StaleConfig(f"{shown}: larger than {MAX_JSON_BYTES:,} bytes; nothing written")
    return data


def rewrite(old: bytes, edits: Sequence[dict[str, object]], *, shown: str) -> bytes:
    """The edits applied to ``old``, each checked against the text the plan saw there."""
    out, pos = [], 0
    for edit in edits:
        offset, length = int(edit["offset"]), int(edit["length"])  # type: ignore[call-overload]  # each edit's offset and length are ints (the plan's spans)
        expected = str(edit["old"]).encode("utf-8")
        if offset < pos or old[offset:offset + length] != expected or len(expected) != length:
            raise StaleConfig(f"{shown}: changed since the scan (byte {offset} no longer holds {edit['old']}); "
                              "nothing written: scan again")
        out += [old[pos:offset], str(edit["new"]).encode("utf-8")]
        pos = offset + length
    out.append(old[pos:])
    return b"".join(out)


def verify_rewrite(old: bytes, new: bytes, edits: Sequence[dict[str, object]]) -> list[str]:
    """What is wrong with ``new`` (empty: it is ``old`` with exactly the planned values replaced)."""
    try:
        before, after = jsonload.loads(old.decode("utf-8")), jsonload.loads(new.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return [f"it does not parse ({str(exc)[:200]})"]
    problems = []
    expected = before
    for edit in edits:
        path = tuple(str(step) for step in edit["path"])  # type: ignore[attr-defined]  # each edit's path is the list of keys the plan recorded
        listed = "value" in edit  # a list's entries rewritten ("new" is their text, "value" the whole list)
        value = json.loads(str(edit["value" if listed else "new"]))
        try:
            spans = find_values(new.decode("utf-8"), path)
        except JsonSpanError as exc:
            return [f"its text cannot be walked ({exc})"]
        if (not spans and not listed) or _get(after, path) != value:
            problems.append(f"{'.'.join(path)} does not hold {edit['new']}")
        expected = _set(expected, path, value)
    # compared as canonical JSON: a NaN in the file equals itself there
    if not problems and json.dumps(expected, sort_keys=True) != json.dumps(after, sort_keys=True):
        problems.append("other values changed")
    return problems


def _get(obj: object, path: tuple[str, ...]) -> object:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def _set(obj: object, path: tuple[str, ...], value: object) -> object:
    """A copy of ``obj`` with ``path`` set (the dicts on the way copied; nothing shared is changed)."""
    if not path:
        return value
    if not isinstance(obj, dict):
        return obj
    return {**obj, path[0]: _set(obj.get(path[0]), path[1:], value)}
