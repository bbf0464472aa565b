"""Core ML: ``.mlpackage`` folders written by ``coremltools.convert``, read as coremltools reads them.

An ML program converted from a traced torch module (fp16 by default, fp32 with
``compute_precision=FLOAT32``) is one set; its blobs are judged against the
program's const ops read through coremltools' own blob reader.  Malformed blob
storage is hand-made bytes: CG001 for the package in well under a second.
"""

from __future__ import annotations

import json
import random
import shutil
import struct
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from bounds import no_hang, traced
from ir_package_writers import built
from scanning import codes, json_scan, sets_of

from guard.inventory.package_dirs import scan_local_package
from guard.readers import READ_FAILURES, scan_file
from guard.readers.coreml.blob import read_mil_blobs
from guard.sources import BytesSource, LocalFile

pytest.importorskip("coremltools")
pytestmark = pytest.mark.slow
WEIGHTS = "Data/com.apple.CoreML/weights/weight.bin"
BLOB_MUTANTS = 1000


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    return built("coreml", tmp_path_factory)


@pytest.mark.parametrize("name", ["default.mlpackage", "full.mlpackage"])
def test_blobs_are_the_programs_consts(packages: tuple[Path, dict[str, Any]], name: str) -> None:
    out, reference = packages
    scan = scan_local_package(out / name, name=name)
    assert scan.format == "coreml", scan.findings
    ours = sorted([t.name, t.dtype, list(t.shape)] for t in scan.tensors)
    assert ours == reference[name]


@pytest.mark.parametrize("name", ["network.mlmodel", "network16.mlmodel", "network8.mlmodel"])
def test_neural_network_weights_are_the_specs(packages: tuple[Path, dict[str, Any]], name: str) -> None:
    out, reference = packages
    with LocalFile(out / name) as source:
        scan = scan_file(source)
    assert scan.format == "coreml", scan.findings
    assert sorted([t.name, t.dtype, list(t.shape)] for t in scan.tensors) == reference[name]
    assert (scan.metadata.get("quantization") == "coreml") == (name == "network8.mlmodel")


def test_neural_network_verdicts(packages: tuple[Path, dict[str, Any]], tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    for name, rc_wanted, wanted in (("network.mlmodel", 0, set()), ("network16.mlmodel", 1, {"CG101"}),
                                    ("network8.mlmodel", 0, set())):  # 8-bit: quantized, not a dtype error
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        shutil.copy(packages[0] / name, folder / name)
        rc, report = json_scan(capsys, str(folder))
        assert (rc, codes(report)) == (rc_wanted, wanted), (name, report["findings"])


def _model(tmp_path: Path, out: Path, *names: str) -> Path:
    folder = tmp_path / "m"
    folder.mkdir()
    for name in names:
        shutil.copytree(out / name, folder / name)
    return folder


def test_fp16_package_is_cg101_naming_compute_precision(packages: tuple[Path, dict[str, Any]], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    folder = _model(tmp_path, packages[0], "default.mlpackage")
    rc, report = json_scan(capsys, str(folder))
    assert rc == 1 and codes(report) == {"CG101"}, report["findings"]
    assert "compute_precision=ct.precision.FLOAT32" in report["findings"][0]["message"]
    assert set(sets_of(report, "m")) == {"default.mlpackage"}
    assert len(report["models"]) == 1  # nothing inside the package is a model of its own
    rc, report = json_scan(capsys, "--expect", "fp16", str(folder))
    assert rc == 0 and report["findings"] == []


def test_fp32_package_passes_whichever_path_names_it(packages: tuple[Path, dict[str, Any]], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder = _model(tmp_path, packages[0], "full.mlpackage")
    package = folder / "full.mlpackage"
    for argument in (folder, package, package / WEIGHTS):  # weight.bin is never a torch file
        rc, report = json_scan(capsys, str(argument))
        assert rc == 0 and report["findings"] == [], (argument, report["findings"])
        assert len(report["models"]) == 1 and report["summary"]["files"] == 1


def test_inline_weights_and_a_lone_ml_program_spec_are_cg006(packages: tuple[Path, dict[str, Any]],
                                                                   tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    folder = _model(tmp_path, packages[0], "full.mlpackage")
    package = folder / "full.mlpackage"
    shutil.rmtree(package / "Data/com.apple.CoreML/weights")
    shutil.copy(package / "Data/com.apple.CoreML/model.mlmodel", folder / "program.mlmodel")  # a spec alone
    rc, report = json_scan(capsys, str(folder))
    assert rc == 0 and codes(report) == {"CG006"} and len(report["findings"]) == 2


def test_broken_packages_are_cg001(packages: tuple[Path, dict[str, Any]], tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    folder = _model(tmp_path, packages[0], "full.mlpackage")
    package = folder / "full.mlpackage"
    weights = package / WEIGHTS
    weights.write_bytes(weights.read_bytes()[:1000])
    rc, report = json_scan(capsys, str(folder))
    assert rc == 1 and codes(report) == {"CG001"}
    manifest = json.loads((package / "Manifest.json").read_text())
    manifest["itemInfoEntries"][manifest["rootModelIdentifier"]]["path"] = "../../etc/passwd"
    (package / "Manifest.json").write_text(json.dumps(manifest))
    rc, report = json_scan(capsys, str(folder))
    assert rc == 1 and "not a path inside the package" in report["findings"][0]["message"]
    (package / "Manifest.json").unlink()
    rc, report = json_scan(capsys, str(folder))
    assert rc == 1 and "without Manifest.json" in report["findings"][0]["message"]


def _storage(count: int, *blobs: tuple[int, int, int, int]) -> bytes:
    """A header for ``count`` blobs, then (sentinel, dtype, size, offset) records with their data."""
    data = bytearray(struct.pack("<II", count, 2).ljust(64, b"\0"))
    for sentinel, dtype, size, offset in blobs:
        data += struct.pack("<IIQQQ", sentinel, dtype, size, offset, 0).ljust(64, b"\0")
        data += b"\0" * min(size, 4096)
        data += b"\0" * (-len(data) % 64)
    return bytes(data)


@pytest.mark.parametrize("data,contains", [
    (_storage(1, (0xDEADBEEF, 2, 16, 128))[:100], "cannot fit"),
    (_storage(2**32 - 1, (0xDEADBEEF, 2, 16, 128)), "cannot fit"),
    (_storage(1, (0xDEADBEEF, 2, 2**63, 128)), "inside the file"),
    (_storage(1, (0xDEADBEEF, 2, 16, 2**64 - 64)), "inside the file"),
    (_storage(1, (0xDEADBEEF, 2, 16, 64)), "not after its metadata"),
    (_storage(1, (0xCAFEBABE, 2, 16, 128)), "sentinel"),
    (_storage(1, (0xDEADBEEF, 2, 15, 128)), "whole F32 elements"),
    (_storage(2, (0xDEADBEEF, 2, 1024, 128)), "past the end"),
    (struct.pack("<II", 1, 1).ljust(64, b"\0"), "version 1"),
    (b"", "past the end"),
], ids=["truncated", "count-2^32", "size-2^63", "offset-wraps", "data-over-metadata", "sentinel", "partial-element",
        "count-too-high", "version-1", "empty"])
def test_hostile_blob_storage_is_refused_quickly(data: bytes, contains: str) -> None:
    with traced() as peak, no_hang(), pytest.raises(READ_FAILURES) as caught:
        read_mil_blobs(BytesSource(data, name="weight.bin"))
    assert contains in str(caught.value), caught.value
    assert peak.bytes < 4 * 2**20


def test_every_blob_type_is_named() -> None:
    blobs = [(0xDEADBEEF, dtype, 64, 128 + 128 * i) for i, dtype in enumerate((1, 2, 3, 5, 8, 14, 16, 99))]
    tensors = read_mil_blobs(BytesSource(_storage(len(blobs), *blobs), name="weight.bin"))
    assert [(t.dtype, t.shape) for t in tensors] == [
        ("F16", (32,)), ("F32", (16,)), ("U8", (64,)), ("BF16", (32,)), ("I4", (128,)), ("I32", (16,)),
        ("F8_E4M3", (64,)), ("coreml:99", (64,))]


def test_hub_scan_reads_packages_remotely_as_locally(packages: tuple[Path, dict[str, Any]], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("huggingface_hub")
    from hub_standin import standin_fixture
    from test_hub_scan import finding_keys, local_and_remote

    folder = _model(tmp_path, packages[0], "default.mlpackage", "full.mlpackage")
    for standin in standin_fixture(monkeypatch, tmp_path):
        rc_local, local, rc_remote, remote = local_and_remote(standin, folder, "org/coreml", monkeypatch)
    assert rc_local == rc_remote == 1
    here, there = finding_keys(local, "m"), finding_keys(remote, "org/coreml")
    expected = {("CG101", f"default.mlpackage/{WEIGHTS}")}
    assert {(c, p) for c, p, _t in here} == {(c, p) for c, p, _t in there} == expected
    assert len(remote["models"]) == 1
    assert sorted(str(m["dtypes"]) for m in local["models"]) == sorted(str(m["dtypes"]) for m in remote["models"])
    stats = {f["path"]: f for f in remote["extra"]["hub"]["repos"][0]["files"]}
    assert stats["full.mlpackage"]["requests"] <= 1 + 6  # the Manifest, then the blob records


# ------------------------------------------------------------------ differential: mutated weight.bin, coremltools

def _reference_blobs(args: tuple[bytes, list[list[Any]]]) -> list[list[Any]] | str:
    """coremltools' blob reader at the offsets and dtypes the (unmutated) program names."""
    import tempfile

    from coremltools.libmilstoragepython import _BlobStorageReader

    data, program = args
    methods = {"F16": "read_fp16_data", "F32": "read_float_data", "I8": "read_int8_data", "U8": "read_uint8_data"}
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "weight.bin").write_bytes(data)
        try:
            reader = _BlobStorageReader(str(Path(tmp, "weight.bin")))
            return sorted([name, code, [len(getattr(reader, methods[code])(int(name.rpartition("@")[2])))]]
                          for name, code, _shape in program)
        except Exception as exc:  # noqa: BLE001 - the reference's refusal is the datum
            return f"coremltools: {' '.join(str(exc).split())[:300]}"


def _our_blobs(data: bytes) -> list[list[Any]] | str:
    try:
        tensors = read_mil_blobs(BytesSource(data, name="weight.bin"), label="weights/weight.bin")
    except READ_FAILURES as exc:
        return f"ours: {exc}"
    return sorted([t.name, t.dtype, list(t.shape)] for t in tensors)


def blob_verdict(ours: list[list[Any]] | str, theirs: list[list[Any]] | str) -> str | None:
    # we walk the header's count of records one after the other, as the writer lays them out; the reference
    # reads each blob at the offset the program gives, so a mutated count, size or offset that moves the next
    # record is ours alone (category sequential-walk)
    if isinstance(ours, str) == isinstance(theirs, str):
        if isinstance(ours, str) or ours == theirs:
            return "agree"
        return "sequential-walk" if all(blob in theirs for blob in ours) else None
    if isinstance(theirs, str):  # the program names the dtype of each blob; a scan of the storage alone cannot
        return "dtype-in-program" if "does not match requested type" in theirs else None
    walk = ("sentinel", "not after its metadata", "cannot fit", "past the end", "whole", "padding bits")
    return "sequential-walk" if any(reason in str(ours) for reason in walk) else None


def test_mutated_blob_storage_agrees_with_coremltools(packages: tuple[Path, dict[str, Any]]) -> None:
    import multiprocessing

    from fuzz_inputs import apply_all, random_mutations

    out, reference = packages
    bases = [((out / name / WEIGHTS).read_bytes(), reference[name]) for name in ("default.mlpackage", "full.mlpackage")]
    rng = random.Random(0)
    tally: Counter[str] = Counter()
    unexplained = []
    with multiprocessing.get_context("fork").Pool(1) as pool:  # an abort in the C++ reader is its refusal
        for i in range(BLOB_MUTANTS):
            base, program = bases[i % len(bases)]
            hot = max(int(name.rpartition("@")[2]) for name, _c, _s in program) + 64
            mutant = apply_all(base, random_mutations(rng, base, hot=hot))
            try:
                theirs = pool.apply_async(_reference_blobs, ((mutant, program),)).get(30)
            except multiprocessing.TimeoutError:
                theirs = "coremltools: no answer"
            ours = _our_blobs(mutant)
            category = blob_verdict(ours, theirs)
            tally[category or "UNEXPLAINED"] += 1
            if category is None:
                unexplained.append((ours, theirs))
    assert not unexplained, (tally, unexplained[:3])
    assert tally["agree"] / BLOB_MUTANTS >= 0.9, tally


def _len_field(number: int, payload: bytes) -> bytes:
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _nested_pipelines(depth: int) -> bytes:
    inner = b""
    for _ in range(depth):  # Model.pipeline (202) > Pipeline.models (1) > Model > ...
        inner = _len_field(202, _len_field(1, inner))
    return inner


_LAYER = _len_field(1, b"fc") + _len_field(140, _len_field(20, _len_field(1, b"\0" * 6)))  # innerProduct.weights


@pytest.mark.parametrize("data,contains", [
    (_nested_pipelines(10_000), "nest more than"),
    (_len_field(500, _len_field(1, _LAYER)), "packed floats of 6 bytes"),
    (_len_field(500, _len_field(1, _LAYER))[:-3], "past the end"),
    (b"\x00" * 64, "invalid protobuf tag"),
    (b"\x82\x1f\xff\xff\xff\xff\x0f", "past the end"),
], ids=["pipelines-10000-deep", "partial-float", "truncated", "zeros", "length-2^32"])
def test_hostile_mlmodel_is_cg001_quickly(data: bytes, contains: str) -> None:
    from fuzz_inputs import assert_refused

    assert_refused(data, "model.mlmodel", contains)
