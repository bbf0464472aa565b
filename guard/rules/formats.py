"""Rules on what a file says about its own dtype: GGUF's ``general.file_type``, Keras' dtype policy.

- CG103: a GGUF file's ``general.file_type`` is a declared dtype, as config.json's
  ``torch_dtype`` is.  It names the main type of the weights (llama.cpp's
  ``llama_model_quantize`` default type per file type); 1-D tensors stay F32 in
  every file type ("mostly X, except 1-d tensors"), so only tensors of 2 dims or
  more are weighed.  A float file type must match the weights' dominant dtype;
  a quantized one is contradicted by weights that are mostly unquantized floats.
  The K- and IQ-mixes legitimately hold several block types, and a small model
  falls back to other types where rows are not a whole number of 256-blocks:
  those are not held against the declaration.
- CG103: a Keras file's dtype policy (``metadata["declared_dtype"]``, the dtype its
  variables are stored in) against the floating weights it holds; layer by layer where
  config.json lists the layers (``guard.rules.config_dtype.keras_layer_findings``).
- Names that claim a dtype (``model_fp16.onnx``, ``*-bf16.gguf``) are the weight sets'
  ``claimed_dtype`` (``guard.inventory.conventions.name_claimed_dtype``), judged by CG108
  in ``guard.rules.variants``.

Each check is a pure function of one FileScan, so the inventory of weight sets
can call it per file; ``check_*`` adapt them to a ModelInventory.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator

from guard import dtypes
from guard.catalogue import make_finding
from guard.config import Policy
from guard.dtypes import display_name as dn
from guard.findings import Finding, shown
from guard.inventory import ModelInventory
from guard.inventory.conventions import NAME_DTYPES, name_claimed_dtype  # noqa: F401  (re-exported)
from guard.rules.config_dtype import keras_layer_findings
from guard.tensors import FileScan, TensorInfo

# general.file_type -> the type llama.cpp quantizes weights to (llama-quant.cpp's default_type)
GGUF_FILE_TYPE_DTYPES: dict[str, str] = {
    "ALL_F32": "F32", "MOSTLY_F16": "F16", "MOSTLY_BF16": "BF16",
    "MOSTLY_Q4_0": "Q4_0", "MOSTLY_Q4_1": "Q4_1", "MOSTLY_Q4_1_SOME_F16": "Q4_1", "MOSTLY_Q5_0": "Q5_0",
    "MOSTLY_Q5_1": "Q5_1", "MOSTLY_Q8_0": "Q8_0", "MOSTLY_Q2_K": "Q2_K", "MOSTLY_Q2_K_S": "Q2_K",
    "MOSTLY_Q3_K_S": "Q3_K", "MOSTLY_Q3_K_M": "Q3_K", "MOSTLY_Q3_K_L": "Q3_K",
    "MOSTLY_Q4_K_S": "Q4_K", "MOSTLY_Q4_K_M": "Q4_K", "MOSTLY_Q5_K_S": "Q5_K", "MOSTLY_Q5_K_M": "Q5_K",
    "MOSTLY_Q6_K": "Q6_K", "MOSTLY_IQ2_XXS": "IQ2_XXS", "MOSTLY_IQ2_XS": "IQ2_XS", "MOSTLY_IQ2_S": "IQ2_XS",
    "MOSTLY_IQ2_M": "IQ2_S", "MOSTLY_IQ3_XXS": "IQ3_XXS", "MOSTLY_IQ3_XS": "IQ3_S", "MOSTLY_IQ3_S": "IQ3_S",
    "MOSTLY_IQ3_M": "IQ3_S", "MOSTLY_IQ1_S": "IQ1_S", "MOSTLY_IQ1_M": "IQ1_M", "MOSTLY_IQ4_NL": "IQ4_NL",
    "MOSTLY_IQ4_XS": "IQ4_XS", "MOSTLY_TQ1_0": "TQ1_0", "MOSTLY_TQ2_0": "TQ2_0",
    "MOSTLY_MXFP4_MOE": "MXFP4", "MOSTLY_NVFP4": "NVFP4", "MOSTLY_Q1_0": "Q1_0",
    "MOSTLY_Q4_0_4_4": "Q4_0_4_4", "MOSTLY_Q4_0_4_8": "Q4_0_4_8", "MOSTLY_Q4_0_8_8": "Q4_0_8_8",
}

def is_gguf_exemption(scan: FileScan, tensor: TensorInfo) -> bool:
    """A 1-D F32 tensor of a GGUF file: every GGUF file type keeps those in F32 by design."""
    return scan.format == "gguf" and tensor.dtype == "F32" and len(tensor.shape) <= 1


def gguf_file_type_findings(scan: FileScan) -> list[Finding]:
    declared = scan.metadata.get("general.file_type", "").removesuffix(" (guessed)")
    main = GGUF_FILE_TYPE_DTYPES.get(declared)
    weights = [t for t in scan.tensors
               if len(t.shape) >= 2 and (dtypes.is_float(t.dtype) or t.dtype in dtypes.QUANTIZED_CODES)]
    if main is None or not weights:
        return []
    totals = _parameters(weights)
    dominant = max(totals, key=totals.__getitem__)
    quantized = main in dtypes.QUANTIZED_CODES
    if (dominant == main) or (quantized and dominant in dtypes.QUANTIZED_CODES):
        return []
    share = totals[dominant] / sum(totals.values())
    example = next(t.name for t in weights if t.dtype == dominant)
    return [make_finding(
        "CG103", scan.path,
        f"general.file_type is {declared} ({dn(main)} weights) but {share:.0%} of the weight parameters "
        f"are {dn(dominant)}; e.g. {shown(example)}", tensor=example)]


def declared_dtype_findings(scan: FileScan, policy: Policy) -> list[Finding]:
    """CG103 for a file that declares its own dtype (a Keras dtype policy) and holds another."""
    if "keras_layer_dtypes" in scan.metadata:  # a .keras with per-layer policies: judged layer by layer
        return keras_layer_findings(scan, policy)
    declared = scan.metadata.get("declared_dtype")
    if declared is None:  # most files declare nothing: no tensor to walk
        return []
    floats = [t for t in scan.tensors if dtypes.is_float(t.dtype) and t.dtype not in dtypes.QUANTIZED_CODES
              and not (t.dtype == "F32" and declared != "F32" and policy.keeps_fp32(t.name))]
    if not floats:
        return []
    totals = _parameters(floats)
    dominant = max(totals, key=totals.__getitem__)
    if dominant == declared:
        return []
    source = scan.metadata.get("declared_dtype_source", "the file's own metadata")
    example = next(t.name for t in floats if t.dtype == dominant)
    return [make_finding(
        "CG103", scan.path,
        f"{source} declares {dn(declared)} but {totals[dominant] / sum(totals.values()):.0%} of the floating "
        f"parameters are {dn(dominant)}; e.g. {shown(example)}", tensor=example)]


def _parameters(tensors: Iterable[TensorInfo]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for tensor in tensors:
        totals[tensor.dtype] += tensor.numel
    return totals


def check_declared_dtypes(inv: ModelInventory, policy: Policy) -> Iterator[Finding]:
    """CG103 from each file's own declaration (GGUF file type, Keras dtype policy), in its weight set."""
    for ws in inv.sets:
        if not ws.judged:
            continue
        for scan in ws.files:
            found = gguf_file_type_findings(scan) if scan.format == "gguf" else declared_dtype_findings(scan, policy)
            yield from (f._replace(set=ws.name) for f in found)
