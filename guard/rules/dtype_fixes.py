"""What the dtype rules' fixes share: a set's cast parameters, and config.json's dtype edits.

CG101/CG102 (``--cast``) and CG103 (``--to-config``) both plan a ``set-cast``; CG103 and a
cast of the primary set both need config.json's dtype keys rewritten.  An edit is the exact
byte span of one value token (``guard.jsonspan``), the text the scan saw there, and the text
to put instead: the file keeps every other byte, and the key it already uses.
"""

from __future__ import annotations

from guard import dtypes
from guard.config import Policy
from guard.fixes import Fix, no_fix
from guard.inventory import ModelInventory, WeightSet

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a scan imports none (the hook's path)
if TYPE_CHECKING:
    from typing import TypedDict

    class ConfigParams(TypedDict):
        """The ``config-dtype`` action's params (guard.fix.actions), beside make_fix's own fields."""

        dir: str
        file: str
        reads: list[str]
        value: str | None  # the dtype's torch name
        edits: list[dict[str, object]]


CASTABLE_FORMATS = ("safetensors",)  # sets set-cast can replace: nothing here writes pickles or msgpack again
DTYPE_KEYS = ("torch_dtype", "dtype")  # transformers' key before 4.56, and since
MAX_CONFIG_DEPTH = 8  # as deep as ModelInventory.config_dtypes reads


def relative(directory: str, path: str) -> str:
    """A display path made relative to its model directory's display path (fix params' convention)."""
    if directory in ("", "."):
        return path
    prefix = directory.rstrip("/") + "/"
    return path[len(prefix):] if path.startswith(prefix) else path.rpartition("/")[2]


def dtype_keys(config: dict[str, object]) -> list[tuple[tuple[str, ...], str]]:
    """(key path, value) of every dtype key, nested configs too: the keys ``config_dtypes`` reads."""
    found: list[tuple[tuple[str, ...], str]] = []
    todo: list[tuple[tuple[str, ...], dict[str, object]]] = [((), config)]
    while todo:
        prefix, obj = todo.pop()
        for key, value in obj.items():
            if key in DTYPE_KEYS and isinstance(value, str):
                found.append(((*prefix, key), value))
            elif isinstance(value, dict) and key != "quantization_config" and len(prefix) < MAX_CONFIG_DEPTH:
                todo.append(((*prefix, key), value))
    return sorted(found)


def config_edits(inv: ModelInventory, code: str) -> list[dict[str, object]] | None:
    """The edits that make every dtype key of config.json say ``code`` ("auto" and unknown names are
    left alone); None where that cannot be planned (no config, not valid JSON, no torch name)."""
    info = dtypes.DTYPES.get(code)
    if info is None or info.torch is None or inv.config_path is None or not isinstance(inv.config, dict):
        return None
    if inv.quantization() is not None:
        return None  # a quantized model's config dtype is its compute dtype: see quantized_no_fix
    edits: list[tuple[int, dict[str, object]]] = []  # (offset, edit)
    for path, value in dtype_keys(inv.config):
        held = dtypes.parse_dtype_name(value)
        if value == "auto" or held is None or held == code:
            continue
        import json  # only where a config dtype is to be rewritten (a config without one: no json.dumps to pay)

        from guard.jsonspan import JsonSpanError, find_values

        new = json.dumps(info.torch)  # what transformers writes: "bfloat16", "float16", "float32"
        try:
            spans = find_values(inv.config_text, path)
        except JsonSpanError:
            return None
        if not spans or json.loads(spans[-1].token) != value:
            return None  # the text and the parsed config disagree: never guess where to write
        edits.extend((span.offset, {**span.to_json(), "new": new, "key": ".".join(path), "path": list(path),
                                    "was": held}) for span in spans)
    return [edit for _, edit in sorted(edits, key=lambda pair: pair[0])]  # in text order


def config_params(inv: ModelInventory, edits: list[dict[str, object]], code: str) -> ConfigParams:
    """The ``config-dtype`` action's params: where, and which edits."""
    name = relative(inv.path, inv.config_path or "config.json")
    return {"dir": inv.path, "file": name, "reads": [name], "value": dtypes.DTYPES[code].torch, "edits": edits}


def set_cast_params(inv: ModelInventory, ws: WeightSet, policy: Policy, *, to: str,
                    policed: dict[str, int]) -> dict[str, object] | None:
    """What ``set-cast`` needs: the set's files (relative to the model directory) and the target dtype.

    ``policed``: elements per dtype the cast changes (``dtype_policy.policed_parameters``: keep-fp32
    tensors left out), for the size the plan shows.

    ``config``: for the primary set, the config.json edits that make it declare ``to`` once the
    cast is written (``guard.fix.plan`` applies them after the cast, and only if it succeeded).
    """
    if ws.format not in CASTABLE_FORMATS or not ws.files or inv.quantization(ws) is not None \
            or ws.claimed_dtype is not None or to not in dtypes.DTYPES or not dtypes.is_float(to):
        return None
    files = [relative(inv.path, scan.path) for scan in ws.files]
    index = [relative(inv.path, i.path) for i in ws.indexes]
    config = [relative(inv.path, inv.config_path)] if inv.config_path else []
    edits = config_edits(inv, to) if ws.primary else None
    return {"dir": inv.path, "set": ws.name, "primary": ws.primary, "variant": ws.variant, "format": ws.format,
            "files": files,
            "index": index[0] if index else None, "reads": files + index + config, "to": to,
            "keep_fp32": list(policy.keep_fp32), "bytes": cast_bytes(ws, to, policed),
            "config": {**config_params(inv, edits, to), "writes": [inv.config_path]} if edits else None}


def quantized_no_fix(inv: ModelInventory, ws: WeightSet | None, code: str) -> Fix | None:
    """Why a quantized set, or its config, gets no dtype fix (the fix field its CG101-CG103 findings carry)."""
    quant = inv.quantization(ws)
    if quant is None:
        return None
    return no_fix(code, f"the set is quantized ({quant.label}): a cast would rewrite its packed weights and scales, "
                        "and config.json's dtype is the compute dtype of its unquantized tensors. Quantize again "
                        "from full-precision weights, or write a full-precision copy with "
                        "`ckpt-guard convert --dequantize`")


def set_writes(inv: ModelInventory, ws: WeightSet) -> tuple[str, ...]:
    return tuple(scan.path for scan in ws.files) + tuple(i.path for i in ws.indexes)


def cast_bytes(ws: WeightSet, to: str, policed: dict[str, int]) -> int:
    """The set's size once cast (an estimate for the plan: headers left out), from the per-dtype sums
    the scan already made: no walk over the tensors."""
    total = 0
    for code, stats in ws.dtype_summary().items():
        cast = policed.get(code, 0)
        total += stats.bytes - (dtypes.nbytes(code, cast) or 0) + (dtypes.nbytes(to, cast) or 0)
    return total
