"""Differential agreement on mutated TorchScript archives: our verdict against torch.jit.load's.

Not a test module: tests/test_torchscript_agreement.py runs a few hundred mutants,
``fuzz/agreement_torchscript.py`` the thousands behind docs/reliability.md.  Half the
mutations aim at the records a reader parses (data.pkl, constants.pkl, the central
directory), half anywhere.  A verdict pair is "agree", a documented category
(``KNOWN``; docs/reliability.md says why each is right) or unexplained (a bug).
"""

from __future__ import annotations

import random
import re
import zipfile
from collections import Counter
from collections.abc import Sequence
from io import BytesIO

from fuzz_inputs import INTERESTING, MUTATIONS, BoundedScan, Mutation, apply_all, assert_well_behaved, bounded_scan
from torchscript_samples import Listing, our_listing, reference_torchscript

# category -> (we accept, pattern on the other side's reason)
KNOWN: dict[str, tuple[bool, str]] = {
    # Headers, not code: a scan reads data.pkl and constants.pkl only.  torch.jit.load also reads,
    # unpickles and compiles code/*.py and their .debug_pkl, and resolves every __torch__ class in
    # them: a mangled one (a syntax error, a bad token, a truncated debug pickle, an unknown op or
    # class, a type it cannot find) is its refusal, which no header says.
    "code-and-records-not-read": (True, r"PytorchStreamReader failed reading file code/|Serialized File \"code/"
                                r"|Expected PROTO opcode|Unknown opcode for unpickling|Unexpected end of pickler"
                                r"|Unknown builtin op|Unknown pickler class id|INTERNAL ASSERT FAILED"
                                r"|Unknown IValue list kind|UnicodeDecodeError|expected .* but found|<--- HERE"
                                r"|Unknown type name|Unexpected token|Parsing error|Unpickler found unknown"
                                r"|failed retrieving file meta-data for code/|not in the map"
                                r"|strings must be qualified Python identifiers|Only Pickle protocol 2 is supported"
                                r"|File \"code/|Can't hash IValues|Arguments for call are not valid"),
    # torch.jit.load crashed, hung or ran out of memory on the mutant (its deserializer is C++);
    # we read it.
    "reference-crashed": (True, r"no answer after|bad_alloc|MemoryError"),
    # data.pkl's and constants.pkl's CRC-32 are checked (torch does not verify CRCs): a flipped
    # bit in a name or a shape is a corrupted file to us, another model to torch.
    "crc-checked": (False, r"does not match its CRC-32"),
    # The archive is held to torch.load's checks (guard.readers.torch.records), which torch.load
    # makes before it hands a TorchScript archive to torch.jit.load: every record name UTF-8 text,
    # .data/serialization_id too, every record inside the archive's folder, byteorder little or big,
    # sizes that agree, names matched exactly (miniz ignores case).  torch.jit.load alone skips some of them.
    "stricter-zip": (False, r"is not UTF-8|not in the archive's folder|byteorder record is|zip does not hold"
                            r"|multi-disk|zip64|End Of Central Directory"
                            r"|does not fit|inconsistent sizes|overlaps|central directory|zip has no "
                            r"|cannot inflate '[^']*/\.data/"),
    # The byteorder record says how every tensor's bytes read, so it is read and its zip records
    # checked (local header, compression method).  torch.jit.load never reads it: torch.load hands
    # a TorchScript archive over before it reads byteorder, and the TorchScript loader reads
    # storages in the machine's order.  A damaged byteorder record is a damaged archive to us.
    "byteorder-read": (False, r"'[^']*/byteorder'"),
    # A storage shorter than its tensor: torch.jit.load reads the record as far as it goes.
    "stricter-storage": (False, r"shorter than its|runs past"),
}


def _valid(ours: BoundedScan) -> bool:
    """Readable and no CG003 error (the note on __torch__ classes is no refusal)."""
    return ours.scan.format is not None and not any(
        f.code == "CG001" or (f.code == "CG003" and f.severity.value == "error") for f in ours.scan.findings)


def explain(ours: BoundedScan, theirs: Listing | str) -> str | None:
    theirs_valid = not isinstance(theirs, str)
    we_accept = _valid(ours)
    if we_accept and theirs_valid:
        return "agree" if our_listing(ours.scan.tensors) == theirs else None
    if not we_accept and not theirs_valid:
        return "agree"
    reason = theirs if we_accept else ours.reason
    for category, (accept, pattern) in KNOWN.items():
        if accept == we_accept and re.search(pattern, str(reason)):
            return category
    return None


def _regions(data: bytes) -> list[tuple[int, int]]:
    """Byte spans of data.pkl, constants.pkl and the central directory."""
    spans = []
    with zipfile.ZipFile(BytesIO(data)) as archive:
        for info in archive.infolist():
            if info.filename.endswith(("/data.pkl", "/constants.pkl")):
                start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
                spans.append((start, start + info.compress_size))
        spans.append((archive.start_dir, len(data)))
    return spans


def _mutations(rng: random.Random, data: bytes, regions: list[tuple[int, int]]) -> list[Mutation]:
    out = []
    for _ in range(rng.randint(1, 3)):
        start, end = rng.choice(regions) if rng.random() < 0.5 else (0, len(data))
        payload = rng.choice(INTERESTING) if rng.random() < 0.6 else rng.randbytes(rng.randint(1, 8))
        out.append(Mutation(rng.choice(MUTATIONS), rng.randrange(start, max(end, start + 1)), payload,
                            rng.randint(1, 64)))
    return out


def agreement_run(bases: Sequence[bytes], *, count: int, seed: int) -> tuple[Counter[str], list[tuple[bytes, str]]]:
    rng = random.Random(seed)
    regions = [_regions(base) for base in bases]
    tally: Counter[str] = Counter()
    unexplained: list[tuple[bytes, str]] = []
    for i in range(count):
        base = bases[i % len(bases)]
        data = apply_all(base, _mutations(rng, base, regions[i % len(bases)]))
        ours = bounded_scan(data, "model.pt")
        assert_well_behaved(ours, data)
        theirs = reference_torchscript(data)
        category = explain(ours, theirs)
        tally[category or "UNEXPLAINED"] += 1
        if category is None:
            unexplained.append((data, f"theirs: {theirs} / ours: {ours.reason or our_listing(ours.scan.tensors)}"))
    return tally, unexplained
