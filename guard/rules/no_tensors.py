"""Never silent: a weight file with no tensors is always a finding (CG001 or the CG007 note).

A reader that took no tensor from a file whose header declares some has failed, and
says so itself (the torch readers' "holds N storage(s) but no tensor"); where a
header states its count (``FileScan.metadata["declared_tensors"]``: GGUF's
``tensor_count``) this rule makes the same CG001 for any reader that did not.  A
file that declares none on purpose (llama.cpp's vocab-only ``ggml-vocab-*.gguf``:
a tokenizer, ``tensor_count`` 0), or that holds none in a format without a count
(``torch.save({})``, an ONNX graph of operators only), is the CG007 note, in weight
and adapter sets only: training state (``training_args.bin``) holds no tensors by
design.  A file with findings of its own (CG001-CG006) is already not silent.
"""

from __future__ import annotations

from guard.catalogue import make_finding
from guard.findings import Finding
from guard.inventory import WeightSet
from guard.tensors import FileScan

_DECLARED_NONE = {  # format -> what a file that declares no tensors is
    "gguf": "the GGUF header declares no tensors (tensor_count 0): a vocab-only file, a tokenizer and "
            "metadata without weights, as llama.cpp ships ggml-vocab-*.gguf",
}


def no_tensor_findings(ws: WeightSet, scan: FileScan) -> list[Finding]:
    if scan.format is None or scan.tensors or scan.findings:
        return []
    declared = scan.metadata.get("declared_tensors", "")
    if declared.isdigit() and int(declared) > 0:
        return [make_finding("CG001", scan.path, f"unreadable checkpoint: the {scan.format} header declares "
                             f"{int(declared):,} tensor(s), and none could be read")]
    if not ws.judged or (scan.training is not None and scan.training.homes):
        return []  # training state whose tensors are all optimizer or other state: its notes list them
    if declared == "0":
        what = _DECLARED_NONE.get(scan.format, f"the {scan.format} header declares no tensors")
        return [make_finding("CG007", scan.path, what)]
    return [make_finding("CG007", scan.path, f"no tensors: this {scan.format} file holds none (its format "
                         "has no tensor count to check against); nothing in it is judged as weights")]
