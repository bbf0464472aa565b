"""Shared by the fuzz tests and fuzz/ scripts: bounded scans, byte mutations, reference loaders.

Not a test module.  ``bounded_scan`` states what "never crashes" means: no
exception, an alarm instead of a hang, and a tracemalloc peak instead of a
guess about memory.  ``REFERENCES`` are the real libraries' verdicts, each an
inventory ``{name: (code, shape)}`` or the reason the library refused the file.
``KNOWN_DISAGREEMENTS`` is the documented list of cases where our verdict and
the library's may differ on purpose (docs/reliability.md explains each).
"""

from __future__ import annotations

import io
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from bounds import HANG_SECONDS, no_hang, traced
from fuzz_formats_a import (
    FILE_NAMES_A,
    FORMATS_A,
    KNOWN_A,
    REFERENCES_A,
    SAMPLERS_A,
    hot_region_a,
)

from guard.readers import scan_file
from guard.sources import BytesSource
from guard.tensors import FileScan

Inventory = dict[str, tuple[str, tuple[int, ...]]]
# file name per reader: the dispatcher sniffs content first, the name only breaks ties
FILE_NAMES = {
    "safetensors": "model.safetensors",
    "torch-zip": "pytorch_model.bin",
    "torch-legacy": "pytorch_model.bin",
    "flax-msgpack": "flax_model.msgpack",
    "hdf5": "model.weights.h5",
    "keras": "model.keras",
}
SCAN_PEAK_BYTES = 4 * 1024 * 1024  # beyond a copy of the input itself


@dataclass(frozen=True)
class BoundedScan:
    scan: FileScan
    seconds: float
    peak_bytes: int

    @property
    def valid(self) -> bool:
        """Our verdict: readable and safe to load (CG005 unknown dtypes stay valid)."""
        return self.scan.format is not None and not any(
            f.code in ("CG001", "CG003") for f in self.scan.findings)

    @property
    def inventory(self) -> Inventory:
        return {t.name: (t.dtype, t.shape) for t in self.scan.tensors}

    @property
    def reason(self) -> str:
        return " / ".join(f.message for f in self.scan.findings if f.code in ("CG001", "CG003"))


def bounded_scan(data: bytes, name: str, *, hang_after: float = HANG_SECONDS) -> BoundedScan:
    """``scan_file`` on in-memory bytes, timed and traced.  Exceptions propagate: a failure;
    a scan still running after ``hang_after`` raises ScanHang."""
    source = BytesSource(data, name=name)
    with traced() as peak, no_hang(hang_after):
        start = time.perf_counter()
        scan = scan_file(source)
        seconds = time.perf_counter() - start
    return BoundedScan(scan, seconds, peak.bytes)


def assert_refused(data: bytes, name: str, contains: str) -> None:
    """A hostile file: CG001 alone, no hang and small, for the reason ``contains`` names."""
    result = bounded_scan(data, name)
    assert_well_behaved(result, data)
    assert result.scan.format is None, result.scan
    assert contains in result.reason, result.reason


def assert_well_behaved(result: BoundedScan, data: bytes) -> None:
    """No exception (bounded_scan lets them through), no hang (its alarm), a small peak, and
    CG001 alone when the file is refused.  Its seconds are for fuzz/ reports, never asserted."""
    limit = SCAN_PEAK_BYTES + len(data)
    assert result.peak_bytes < limit, f"scan peaked at {result.peak_bytes:,} bytes (limit {limit:,})"
    if result.scan.format is None:
        assert [f.code for f in result.scan.findings] == ["CG001"]


# ------------------------------------------------------------------ mutations

MUTATIONS = ("flip", "truncate", "insert", "overwrite", "splice")
# bytes a format gives meaning to: lengths, markers, quotes, digits, pickle and msgpack opcodes
INTERESTING = (b"\x00", b"\xff", b"\x7f", b"\x80", b"{", b"}", b"[", b"]", b'"', b",", b":", b"9",
               b"-", b"\n", b"\x8a", b"\x94", b"\x93", b"\xc4", b"\xc7", b"\xdf", b"PK\x01\x02",
               b"\xff\xff\xff\xff", b"\x00\x00\x00\x80", b"\x00\x00\x00\x00\x00\x00\x00\x40")


@dataclass(frozen=True)
class Mutation:
    kind: str
    position: int  # reduced modulo the length when applied
    payload: bytes = b""
    length: int = 1

    def apply(self, data: bytes) -> bytes:
        if not data:
            return self.payload
        at = self.position % len(data)
        if self.kind == "flip":
            return data[:at] + bytes([data[at] ^ (1 << (self.length % 8))]) + data[at + 1 :]
        if self.kind == "truncate":
            return data[:at]
        if self.kind == "insert":
            return data[:at] + self.payload + data[at:]
        if self.kind == "overwrite":
            return data[:at] + self.payload + data[at + len(self.payload) :]
        if self.kind == "splice":  # copy a run of the file over another place in it
            src = (self.position * 7919 + self.length) % len(data)
            chunk = data[src : src + self.length]
            return data[:at] + chunk + data[at + len(chunk) :]
        raise ValueError(self.kind)


def apply_all(data: bytes, mutations: Sequence[Mutation]) -> bytes:
    for mutation in mutations:
        data = mutation.apply(data)
    return data


def hot_region(fmt: str, data: bytes) -> int:
    """How many leading bytes hold the structure (half the mutations aim there)."""
    if fmt in FORMATS_A:
        return hot_region_a(fmt, data) or len(data)
    if fmt == "safetensors" and len(data) >= 8:
        return min(len(data), 8 + int.from_bytes(data[:8], "little"))
    return len(data)


def random_mutations(rng: random.Random, data: bytes, *, hot: int) -> list[Mutation]:
    out = []
    for _ in range(rng.randint(1, 3)):
        span = hot if rng.random() < 0.5 and hot else max(len(data), 1)
        kind = rng.choice(MUTATIONS)
        payload = rng.choice(INTERESTING) if rng.random() < 0.6 else rng.randbytes(rng.randint(1, 8))
        out.append(Mutation(kind, rng.randrange(span), payload, rng.randint(1, 64)))
    return out


# ------------------------------------------------------------------ reference loaders

def reference_safetensors(data: bytes) -> Inventory | str:
    """The Rust deserializer's verdict, then ``get_tensor`` (torch) for every tensor."""
    import safetensors
    from safetensors.torch import load

    try:
        entries = safetensors.deserialize(data)
    except Exception as exc:  # noqa: BLE001 - the reference's refusal is the datum we record
        return f"safetensors: {_first_line(exc)}"
    inventory = {name: (str(info["dtype"]), tuple(info["shape"])) for name, info in entries}
    try:
        load(data)
    except Exception as exc:  # noqa: BLE001
        return f"get_tensor: {_first_line(exc)}"
    return inventory


def reference_torch(data: bytes) -> Inventory | str:
    import torch

    try:
        obj = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001
        return f"torch.load: {_first_line(exc)}"
    return {name: (torch_code(t), tuple(t.shape))
            for name, t in flatten(obj, ".", lambda v: isinstance(v, torch.Tensor))}


def reference_flax(data: bytes) -> Inventory | str:
    import numpy as np
    from flax import serialization

    from guard.dtypes import NUMPY_NAMES

    try:
        tree = serialization.msgpack_restore(data)
    except Exception as exc:  # noqa: BLE001
        return f"msgpack_restore: {_first_line(exc)}"
    return {name: (NUMPY_NAMES.get(leaf.dtype.name, leaf.dtype.name), tuple(np.shape(leaf)))
            for name, leaf in flatten(tree, "/", lambda v: isinstance(v, (np.ndarray, np.generic)))}


# ---- HDF5: h5py is C and can spin on a corrupt file, so the reference runs in a forked
# pool worker that is replaced after REFERENCE_SECONDS; a hang counts as the reference's refusal.
REFERENCE_SECONDS = 3.0
_H5_POOL: Any = None


def _h5_listing(data: bytes) -> Inventory | str:
    import h5py

    from guard.dtypes import NUMPY_NAMES

    out: Inventory = {}

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset) and obj.shape is not None:
            dtype = obj.dtype
            code = NUMPY_NAMES.get(dtype.name) if dtype.kind in "fiubc" else None
            if dtype.kind == "V" and "dtype" in obj.attrs:
                declared = obj.attrs["dtype"]
                declared = declared.decode() if isinstance(declared, bytes) else str(declared)
                code = NUMPY_NAMES.get(declared)
                if code is None or int(dtype.itemsize) * 8 != {"BF16": 16}.get(code, 8):
                    code = f"{declared} (opaque {dtype.itemsize}-byte)"
            out[name] = (code or f"hdf5:{dtype.str}", tuple(int(d) for d in obj.shape))

    try:
        with h5py.File(io.BytesIO(data), "r") as f:
            f.visititems(visit)
    except Exception as exc:  # noqa: BLE001
        return f"h5py: {_first_line(exc)}"
    return out


def _in_pool(function: Callable[[bytes], Inventory | str], data: bytes, *, seconds: float = REFERENCE_SECONDS,
             library: str = "h5py: no answer after {seconds:g} s (libhdf5 spins)") -> Inventory | str:
    import multiprocessing

    global _H5_POOL
    if _H5_POOL is None:
        _H5_POOL = multiprocessing.get_context("fork").Pool(1)
    try:
        return _H5_POOL.apply_async(function, (data,)).get(seconds)
    except multiprocessing.TimeoutError:
        _H5_POOL.terminate()
        _H5_POOL = None
        return library.format(seconds=seconds)


def reference_hdf5(data: bytes) -> Inventory | str:
    return _in_pool(_h5_listing, data)


def _keras_listing(data: bytes) -> Inventory | str:
    import json
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            json.loads(archive.read("config.json"))
            weights = archive.read("model.weights.h5")
    except Exception as exc:  # noqa: BLE001
        return f"zipfile: {_first_line(exc)}"
    return _h5_listing(weights)


def reference_keras(data: bytes) -> Inventory | str:
    return _in_pool(_keras_listing, data)


REFERENCES: dict[str, Callable[[bytes], Inventory | str]] = {
    "safetensors": reference_safetensors,
    "torch-zip": reference_torch,
    "torch-legacy": reference_torch,
    "flax-msgpack": reference_flax,
    "hdf5": reference_hdf5,
    "keras": reference_keras,
}


def _first_line(exc: BaseException) -> str:
    # torch puts the actual reason ("Unsupported operand 148") lines below its boilerplate
    text = " ".join(str(exc).split())
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1]
    return f"{type(exc).__name__}: {text[:300]}"


def torch_code(tensor: Any) -> str:
    from guard.dtypes import TORCH_NAMES

    name = str(tensor.dtype).removeprefix("torch.")
    return TORCH_NAMES.get(name, name)


def flatten(obj: object, sep: str, is_leaf: Callable[[object], bool], prefix: str = ""
            ) -> Iterator[tuple[str, Any]]:
    if is_leaf(obj):
        yield prefix or "<root>", obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from flatten(value, sep, is_leaf, f"{prefix}{sep}{key}" if prefix else str(key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from flatten(value, sep, is_leaf, f"{prefix}{sep}{i}" if prefix else str(i))


# ------------------------------------------------------------------ differential verdicts

@dataclass(frozen=True)
class Known:
    """A documented disagreement: which side accepts, and a pattern on the other side's reason."""

    category: str
    formats: tuple[str, ...]
    we_accept: bool  # True: we accept, the reference refuses; False: the reverse
    pattern: str  # searched in the reference's reason (we_accept) or ours (not we_accept)


_TORCH = ("torch-zip", "torch-legacy")
KNOWN_DISAGREEMENTS: tuple[Known, ...] = (
    # Our CG005 is a warning on a readable file; every reference refuses an unknown dtype (a GGUF type outside
    # ggml's registry: our CG009 error, fuzz_formats_a's row).
    Known("unknown-dtype", ("safetensors", "torch-zip", "torch-legacy", "flax-msgpack"), True, r"^CG00[59]$"),
    # A valid header whose dtype torch cannot build (F6_*, F4): safe_open + get_tensor fails.
    Known("torch-lacks-dtype", ("safetensors",), True, r"^get_tensor: KeyError"),
    # A header naming a tensor twice: serde_json keeps the last entry, as json.loads does, and the Rust reader
    # loads it if that entry's offsets tile; a reader that keeps the first would load other weights under
    # the same name, so we refuse the file.
    Known("duplicate-name", ("safetensors",), False, r"duplicate key .* in header"),
    # Headers, not tensors: a scan never opens the byteorder, version or data/* records
    # (nor checks their local headers and CRCs), which torch.load reads in full.
    Known("records-not-read", ("torch-zip",), True,
          r"PytorchStreamReader failed (reading|retrieving) file|Unknown endianness type"
          r"|hasRecord\(\"version\"\)|not in a subdirectory|UnicodeDecodeError"
          r"|Couldn't parse the version|invalid literal for int\(\)|failed reading zip archive"
          r"|Attempted to read a PyTorch file with version"),
    Known("records-not-read", ("torch-legacy",), True, r"storage has wrong byte size"),
    # torch.load calls the rebuild functions; a description does not check their arguments.
    Known("call-semantics", _TORCH, True,
          r"can require gradients|positional argument|takes \d+ positional"),
    # torch's weights-only unpickler implements a subset of opcodes (no MEMOIZE); we walk them all.
    Known("opcode-subset", _TORCH, True, r"Unsupported operand"),
    # miniz matches names case-insensitively and ignores disk numbers, a bad zip64 record
    # and a wrong comment length; we refuse a zip whose records disagree (data.pkl or a storage
    # found only under another case, two records whose names differ only in case).
    Known("stricter-zip", ("torch-zip",), False,
          r"zip does not hold|multi-disk|zip64|End Of Central Directory|does not fit|inconsistent sizes"
          r"|overlaps|differ only in case"),
    # torch does not verify CRCs when it reads (miniz's reader checks are compiled out); we check
    # data.pkl's, so a flipped bit in a name or a shape is a corrupted file, not another model.
    Known("crc-checked", ("torch-zip",), False, r"does not match its CRC-32"),
    # A storage bigger than its record, or a tensor whose storage is not in the legacy key
    # list: torch.load fills it with uninitialised memory; we refuse the file.
    Known("stricter-storage", _TORCH, False,
          r"shorter than its|missing from the storage list|runs past"),
    # Never silent: storages that no tensor of the pickle uses are CG001 when no tensor is read at
    # all; torch.load returns the object without them (an empty dict, a number).
    Known("storages-without-tensors", _TORCH, False, r"storage\(s\) but no tensor"),
    # The legacy magic is checked byte for byte, pickle protocol 2-5 (the sniffer); torch parses it
    # as a pickle whatever its PROTO byte says, so a mangled one is not a weight file to us.
    Known("stricter-magic", ("torch-legacy",), False,
          r"not a safetensors, torch|not a weight file of a format read here|magic number"),
    # msgpack decodes any value; a flax state dict is a map of str keys with array leaves.
    Known("not-a-flax-tree", ("flax-msgpack",), False,
          r"top level is|map key|duplicate key|shape is not a list"),
    # Headers, not tensors: the weights member of a .keras zip is never read whole, so
    # its CRC-32 is not checked (config.json and metadata.json are read whole and checked);
    # zipfile (and so keras.saving.load_model) checks it on extraction.
    Known("data-crc-not-read", ("keras",), True, r"Bad CRC-32 for file 'model\.weights\.h5'"),
    # The zip directory is read as zipfile reads it (by its declared size, whatever the entry
    # count), but records that disagree are refused where zipfile tolerates them: a wrong comment
    # length, stray bytes before the end record, entries that share bytes (the overlapping-entry
    # zip bomb) even where the one that overlaps is metadata.json, which Keras does not load.
    Known("stricter-zip", ("keras",), False,
          r"zip central directory|End Of Central Directory|does not fit|zip64|multi-disk"
          r"|two different sizes|overlaps|stray bytes between the zip directory"),
    # zipfile refuses an entry whose "version needed to extract" is above 6.3; that field says
    # nothing about how a stored or deflated member is laid out, and we do not read it.
    Known("zip-version-needed", ("keras",), True, r"zip file version"),
    # h5py hands back an object name that is not UTF-8 as bytes; a tensor name must be text.
    Known("non-utf8-name", ("hdf5", "keras"), False, r"name is not UTF-8"),
)


def explain(fmt: str, ours: BoundedScan, theirs: Inventory | str) -> str | None:
    """'agree', a KNOWN_DISAGREEMENTS category, or None: an unexplained disagreement (a bug)."""
    theirs_valid = not isinstance(theirs, str)
    if ours.valid and theirs_valid:
        return "agree" if ours.inventory == theirs else None
    if not ours.valid and not theirs_valid:
        return "agree"
    codes = {f.code for f in ours.scan.findings}
    for known in KNOWN_DISAGREEMENTS:
        if fmt not in known.formats or known.we_accept != ours.valid:
            continue
        if known.category == "unknown-dtype":
            if codes & {"CG005", "CG009"}:
                return known.category
            continue
        reason = theirs if ours.valid else ours.reason
        if re.search(known.pattern, str(reason)):
            return known.category
    return None


def differential_run(fmt: str, bases: Sequence[bytes], *, count: int, seed: int
                     ) -> tuple[Counter[str], list[tuple[bytes, str]]]:
    """Mutate ``bases`` ``count`` times; tally the verdict categories, keep unexplained inputs."""
    rng = random.Random(seed)
    tally: Counter[str] = Counter()
    unexplained: list[tuple[bytes, str]] = []
    for i in range(count):
        base = bases[i % len(bases)]
        data = apply_all(base, random_mutations(rng, base, hot=hot_region(fmt, base)))
        ours = bounded_scan(data, FILE_NAMES[fmt])
        assert_well_behaved(ours, data)
        theirs = REFERENCES[fmt](data)
        category = explain(fmt, ours, theirs)
        tally[category or "UNEXPLAINED"] += 1
        if category is None:
            unexplained.append((data, f"ours: {ours.reason or ours.inventory} / theirs: {theirs}"))
    return tally, unexplained


# ------------------------------------------------------------------ sample checkpoints (real writers)

def sample_checkpoints(fmt: str) -> list[bytes]:
    """A few small, varied files written by the real libraries: seeds and mutation bases."""
    return _SAMPLERS[fmt]()


def _torch_state() -> list[dict[str, Any]]:
    import torch

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(4, 3, generator=gen)
    return [
        {"a.weight": w, "a.bias": torch.zeros(4), "ids": torch.arange(5), "scalar": torch.tensor(2.0)},
        {"h": torch.ones(2, 2, dtype=torch.bfloat16), "f": torch.ones(3, dtype=torch.float16),
         "m": torch.tensor([True, False]), "e": torch.zeros(0, 3), "i8": torch.ones(2, dtype=torch.int8)},
        {"tied": w, "tied_again": w, "t": w.T, "row": w[1:], "nested": {"x": torch.ones(1, dtype=torch.float64)}},
        {"fp8": torch.zeros(4, dtype=torch.float8_e4m3fn), "u16": torch.zeros(2, dtype=torch.uint16),
         "c": torch.zeros(2, dtype=torch.complex64)},
    ]


def _safetensors_samples() -> list[bytes]:
    from safetensors.torch import save

    out = []
    for i, state in enumerate(_torch_state()):
        flat = {k: v.contiguous().clone() for k, v in flatten(state, ".", lambda v: hasattr(v, "dtype"))}
        # The library writes its metadata map in hash order (a Rust HashMap): the draw in which it
        # comes out sorted is kept, so a seeded mutation sample is the same on every run.
        data = save(flat, metadata={"format": "pt", "n": str(i)})
        while b'{"__metadata__":{"format"' not in data[:64]:
            data = save(flat, metadata={"format": "pt", "n": str(i)})
        out.append(data)
    return out


def _torch_zip_samples() -> list[bytes]:
    import torch

    out = []
    for state in _torch_state():
        buf = io.BytesIO()
        torch.save(state, buf)
        out.append(buf.getvalue())
    return out


def _torch_legacy_samples() -> list[bytes]:
    import torch

    out = []
    for state in _torch_state()[:3]:  # the legacy writer predates fp8 and uint16 storages
        buf = io.BytesIO()
        torch.save(state, buf, _use_new_zipfile_serialization=False)
        out.append(_numbered_storages(buf.getvalue(), state))
    return out


def _numbered_storages(data: bytes, state: dict[str, Any]) -> bytes:
    """The legacy file with its storages keyed 0, 1, ... in the order the pickle meets them.

    The writer keys each storage by its address (``str(storage._cdata)``) and writes the data
    in the keys' sorted order, so the bytes change from run to run.  Renumbered with keys of
    the same length, the key list written again as the writer writes it (a protocol-2 pickle)
    and the storages' bytes put in that order, every run draws the same seeded mutation sample.
    """
    import pickle
    import pickletools

    seen: dict[str, int] = {}  # address -> element size, first meeting first
    for _name, tensor in flatten(state, ".", lambda v: hasattr(v, "untyped_storage")):
        seen.setdefault(str(tensor.untyped_storage()._cdata), tensor.element_size())
    width = len(next(iter(seen)))
    if any(len(key) != width for key in seen):  # addresses of one width keep every offset
        return data
    new_key = {key: str(rank).zfill(width) for rank, key in enumerate(seen)}
    stream = io.BytesIO(data)
    for _ in range(4):  # magic number, protocol, sys_info, the object
        for _op in pickletools.genops(stream):
            pass
    keys_at = stream.tell()
    for _op in pickletools.genops(stream):
        pass
    old_keys = pickle.loads(data[keys_at:stream.tell()])  # our own writer's list of strings
    chunks, at = {}, stream.tell()
    for key in old_keys:
        size = 8 + int.from_bytes(data[at:at + 8], "little") * seen[key]
        chunks[new_key[key]], at = data[at:at + size], at + size
    head = data[:keys_at]
    for old, new in new_key.items():
        head = head.replace(old.encode(), new.encode())
    keys = sorted(chunks)
    return head + pickle.dumps(keys, protocol=2) + b"".join(chunks[key] for key in keys) + data[at:]


def _flax_samples() -> list[bytes]:
    import ml_dtypes
    import numpy as np
    from flax import serialization

    rng = np.random.default_rng(0)
    trees: list[dict[str, Any]] = [
        {"params": {"Dense_0": {"kernel": rng.standard_normal((3, 4)).astype(np.float32),
                                "bias": np.zeros(4, np.float32)}}},
        {"p": {"bf": np.ones((2, 2), ml_dtypes.bfloat16), "f8": np.zeros(3, ml_dtypes.float8_e4m3fn),
               "i": np.arange(3, dtype=np.int32), "s": np.float32(1.5), "b": np.array([True])},
         "step": 3, "name": "x"},
        {"layers": {"0": {"w": np.zeros((0, 2), np.float16)}, "1": {"w": np.ones(1, np.float64)}}},
    ]
    return [serialization.msgpack_serialize(tree) for tree in trees]


def _hdf5_samples() -> list[bytes]:
    """h5py-written weights: Keras 3 layout (bf16 opaque + attribute), Keras-2 layout."""
    import tempfile
    from pathlib import Path

    import h5py
    import ml_dtypes
    import numpy as np

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.h5"
        with h5py.File(path, "w") as f:
            f.create_group("vars")
            for layer, dtype in (("dense", np.float32), ("norm", ml_dtypes.bfloat16)):
                group = f.create_group(f"layers/{layer}/vars")
                for i, shape in enumerate(((4, 3), (3,))):
                    value = np.ones(shape, dtype)
                    if dtype is ml_dtypes.bfloat16:
                        group.create_dataset(str(i), data=value.view("V2")).attrs["dtype"] = "bfloat16"
                    else:
                        group.create_dataset(str(i), data=value)
        out.append(path.read_bytes())
        with h5py.File(path, "w") as f:
            f.attrs["layer_names"] = [b"bert", b"classifier"]
            f.attrs["keras_version"] = b"2.15.0"
            f["bert/bert/embeddings/weight:0"] = np.zeros((6, 4), np.float16)
            f["classifier/classifier/bias:0"] = np.zeros((2,), np.float32)
            f["classifier/classifier/kernel:0"] = np.zeros((4, 2), np.float32)
        out.append(path.read_bytes())
        with h5py.File(path, "w", libver="latest") as f:  # new-style groups, superblock v3
            f.create_dataset("a/b/c", data=np.arange(6, dtype=np.int64).reshape(2, 3), chunks=(1, 3))
            f["a/flag"] = np.array([True, False])
        out.append(path.read_bytes())
    return out


KERAS_SAVED_AT = (2025, 1, 1, 0, 0, 0)  # the members' zip timestamp (Keras writes the time of the save)


def _keras_samples() -> list[bytes]:
    """.keras archives as Keras 3 lays them out (stored members), around h5py weights.

    Keras stamps each member with the time of the save; here it is a fixed time, so that the
    seeded mutants are the same on every run."""
    import json
    import zipfile

    out = []
    for i, weights in enumerate(_hdf5_samples()[:2]):
        buffer = io.BytesIO()
        policy = ("float32", "mixed_bfloat16")[i]
        config = {"module": "keras", "class_name": "Sequential", "config": {
            "name": "sequential", "dtype": {"module": "keras", "class_name": "DTypePolicy",
                                            "config": {"name": policy}}, "layers": []}}
        with zipfile.ZipFile(buffer, "w") as archive:
            for name, content in (("metadata.json", json.dumps({"keras_version": "3.15.1"})),
                                  ("config.json", json.dumps(config)), ("model.weights.h5", weights)):
                archive.writestr(zipfile.ZipInfo(name, date_time=KERAS_SAVED_AT), content)
        out.append(buffer.getvalue())
    return out


_SAMPLERS: dict[str, Callable[[], list[bytes]]] = {
    "safetensors": _safetensors_samples,
    "torch-zip": _torch_zip_samples,
    "torch-legacy": _torch_legacy_samples,
    "flax-msgpack": _flax_samples,
    "hdf5": _hdf5_samples,
    "keras": _keras_samples,
}


# ------------------------------------------------------------------ GGUF, ONNX, NumPy (fuzz_formats_a)

FILE_NAMES.update(FILE_NAMES_A)
REFERENCES.update(REFERENCES_A)
_SAMPLERS.update(SAMPLERS_A)
KNOWN_DISAGREEMENTS += tuple(Known(*known) for known in KNOWN_A)


# ------------------------------------------------------------------ torch.export .pt2 (fuzz_formats_export)

from fuzz_formats_export import FILE_NAMES_EXPORT, KNOWN_EXPORT, REFERENCES_EXPORT, SAMPLERS_EXPORT  # noqa: E402

FILE_NAMES.update(FILE_NAMES_EXPORT)
REFERENCES.update(REFERENCES_EXPORT)
_SAMPLERS.update(SAMPLERS_EXPORT)
KNOWN_DISAGREEMENTS += tuple(Known(*known) for known in KNOWN_EXPORT)


# ------------------------------------------------------------------ TF bundle indexes, TFLite (fuzz_formats_tf)

from fuzz_formats_tf import FILE_NAMES_TF, KNOWN_TF, REFERENCES_TF, SAMPLERS_TF  # noqa: E402

FILE_NAMES.update(FILE_NAMES_TF)
REFERENCES.update(REFERENCES_TF)
_SAMPLERS.update(SAMPLERS_TF)
KNOWN_DISAGREEMENTS += tuple(Known(*known) for known in KNOWN_TF)
