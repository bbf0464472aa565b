"""A finding's fix, as data (STYLE rule 14): what it writes, and whether it is safe or needs a flag.

The rule that raises a finding plans its fix (``Finding.fix``); ``guard.fix`` applies it in
one place (temp names, renames, verification, rollback); reporters only show it.  Findings
that no mechanical change can repair carry a ``Fix`` with ``safety == "none"`` whose
description says why.  ``params`` is JSON text: the action's arguments, lossless through the
JSON report and hashable in the record.
"""

from __future__ import annotations

from guard.records import Record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a scan imports none (the hook's path)
if TYPE_CHECKING:
    from typing import Any

SAFETIES = ("safe", "needs-flag", "unsafe", "none")  # unsafe: shown, applied only with --unsafe-fixes (ruff's)

# The actions guard.fix knows how to apply: the one table (guard.fix.actions.stage reads it), each action's
# name -> "module:function" of the function that stages it, imported on first use: a config rewrite loads no
# numpy, a weight fix loads no transformers.  In the order fixes apply (guard.fix.plan.APPLY_ORDER): weights
# before the files that describe them, a config rewrite or an index last.
ACTIONS: dict[str, str] = {
    # CG008: write model.safetensors (or shards + index) beside pickle-only weights
    "safetensors-copy": "guard.fix.actions.safetensors_copy:stage_safetensors_copy",
    # CG101/CG102 --cast, CG103 --to-config: the set in another dtype (replaces it)
    "set-cast": "guard.fix.actions.cast:stage_set_cast",
    # CG108: the variant recast to the dtype its name claims (replaces it)
    "variant-recast": "guard.fix.actions.cast:stage_variant_recast",
    # CG109: the missing variant files, cast from the default set
    "variant-add": "guard.fix.actions.cast:stage_variant_add",
    # CG107: the stale copy regenerated from the primary set, bit-exactly
    "copy-regenerate": "guard.fix.actions.copies:stage_copy_regenerate",
    "add-copy": "guard.fix.actions.copies:stage_add_copy",  # --add flax|orbax|safetensors|variant:fp16|variant:bf16
    # CG109: a variant's shards without their index: the index, from the shards' headers
    "index-rebuild": "guard.fix.actions.index:stage_index_rebuild",
    # CG103: rewrite torch_dtype / dtype in config.json, byte for byte but the value
    "config-dtype": "guard.fix.actions.config_dtype:stage_config_dtype",
    # CG124 (unsafe): one integer field of config.json (a layer count), byte for byte but the value
    "config-field": "guard.fix.actions.config_dtype:stage_config_field",
}

# Why some findings have no mechanical fix: the bytes that would fix them are not here.
NO_FIX = {
    "CG001": "the file cannot be parsed, so there is nothing to convert from: re-export it from the original weights",
    "CG002": "a Git LFS pointer holds no weights: fetch the real file (`git lfs pull`, or `lfs: true` on checkout)",
    "CG003": "the pickle references code outside the tensor allowlist; it is never run, so its tensors cannot be "
             "trusted or copied: re-export the weights from a trusted source",
    "CG004": "shards are missing, truncated or disagree with their index: the missing bytes are not here",
    "CG005": "the dtype is unknown to ckpt-guard, so it cannot be carried or cast",
    "CG006": "no reader handles this format, so nothing can be written from it",
}


class Fix(Record):
    action: str  # one of ACTIONS, or "" when safety is "none"
    description: str  # what the fix changes; with safety "none", why no fix exists
    safety: str = "safe"  # one of SAFETIES
    flag: str | None = None  # what a needs-flag or unsafe fix waits for: "--replace", "--cast", "--unsafe-fixes", ...
    writes: tuple[str, ...] = ()  # paths written or rewritten, spelled as findings' paths are
    params: str = "{}"  # JSON: the action's arguments

    @property
    def available(self) -> bool:
        return self.safety != "none"

    @property
    def arguments(self) -> dict[str, Any]:  # parsed JSON: each action checks the types it reads
        import json  # json here and below: only where a fix is planned or read (a clean scan has none)

        value = json.loads(self.params)
        return value if isinstance(value, dict) else {}

    def to_json(self) -> dict[str, object]:
        return {"available": self.available, "safety": self.safety, "description": self.description,
                "writes": list(self.writes), "action": self.action or None, "flag": self.flag,
                "params": self.arguments}

    @classmethod
    def from_json(cls, obj: object) -> Fix | None:
        if not isinstance(obj, dict):
            return None
        import json

        safety = str(obj.get("safety") or "none")
        writes = obj.get("writes")
        return cls(action=str(obj.get("action") or ""), description=str(obj.get("description", "")),
                   safety=safety if safety in SAFETIES else "none",
                   flag=None if obj.get("flag") is None else str(obj["flag"]),
                   writes=tuple(str(w) for w in writes) if isinstance(writes, list) else (),
                   params=json.dumps(obj.get("params") if isinstance(obj.get("params"), dict) else {},
                                     sort_keys=True))


def make_fix(action: str, description: str, *, safety: str = "safe", flag: str | None = None,
             writes: tuple[str, ...] = (), **params: object) -> Fix:
    import json

    assert action in ACTIONS and safety in SAFETIES, (action, safety)
    return Fix(action, description, safety, flag, writes, json.dumps(params, sort_keys=True))


def no_fix(code: str, advice: str, *, path: str = "", message: str = "") -> Fix:
    """The fix field of a finding that no mechanical change repairs: the reason, or the rule's advice."""
    if code == "CG001" and path.endswith(".json"):
        return _invalid_json(path, message)
    reason = NO_FIX.get(code)
    return Fix("", reason or f"no mechanical fix: {advice}", "none")


def _invalid_json(path: str, message: str) -> Fix:
    """A JSON file (config.json, an index, a tokenizer's config) a person can correct: where it breaks, not the
    weights' advice (re-exporting them would not touch a trailing comma)."""
    import re  # a broken JSON file only

    name = path.rpartition("/")[2]
    at = re.search(r"line (\d+) column (\d+)", message)
    where = f" at line {at[1]}, column {at[2]}" if at else ""
    reason = re.sub(r": line \d+ column \d+ \(char \d+\)", "", message.partition("not valid JSON: ")[2])
    why = f" ({reason})" if reason else ""
    return Fix("", f"{name} is not valid JSON{where}{why}: correct the file there by hand (`python -m json.tool "
                   f"{name}` points at the spot); the weights need nothing", "none")
