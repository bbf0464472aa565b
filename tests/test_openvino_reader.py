"""OpenVINO IR: files written by ``openvino.convert_model`` + ``save_model``, read as ``Core().read_model`` reads them.

Valid IRs come from the real writer (compressed to f16 by default, f32 with
``compress_to_fp16=False``, NNCF-style u8/u4 weights built with the opset API,
optimum-intel's folder layout), judged against ``read_model``'s Constant ops.
Malformed ones are hand-made XML: CG001 in well under a second, within a few MB.
"""

from __future__ import annotations

import random
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fuzz_inputs import assert_refused, assert_well_behaved, bounded_scan
from ir_package_writers import built
from scanning import codes, json_scan, sets_of

from guard.readers import scan_file
from guard.sources import BytesSource, LocalFile

pytest.importorskip("openvino")
pytestmark = pytest.mark.slow
MUTANTS = 1000


@pytest.fixture(scope="module")
def irs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    return built("openvino", tmp_path_factory)


def _ours(path: Path) -> list[list[Any]]:
    with LocalFile(path) as source:
        scan = scan_file(source)
    assert scan.format == "openvino", scan.findings
    return sorted([t.dtype, list(t.shape)] for t in scan.tensors)


@pytest.mark.parametrize("name", ["compressed.xml", "fp32.xml", "int8.xml", "loop.xml", "optimum/openvino_model.xml"])
def test_constants_are_read_model_s(irs: tuple[Path, dict[str, Any]], name: str) -> None:
    out, reference = irs
    assert _ours(out / name) == reference[name]


def _folder(tmp_path: Path, out: Path, *names: str) -> Path:
    folder = tmp_path / "m"
    folder.mkdir()
    for name in names:
        for suffix in (".xml", ".bin"):
            shutil.copy(out / (name + suffix), folder / (name + suffix))
    return folder


def test_compress_to_fp16_default_is_cg101_naming_the_cause_and_expect_fp16_accepts_it(
        irs: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _folder(tmp_path, irs[0], "compressed")
    rc, report = json_scan(capsys, str(folder))
    assert rc == 1 and codes(report) == {"CG101"}
    message = report["findings"][0]["message"]
    assert "compress_to_fp16=True" in message and "--expect fp16" in message
    assert set(sets_of(report, "m")) == {"compressed.xml"}  # the .bin is the .xml's, not a set of its own
    rc, report = json_scan(capsys, "--expect", "fp16", str(folder))
    assert rc == 0 and report["findings"] == []


def test_uncompressed_ir_passes_and_its_bin_is_never_a_torch_file(
        irs: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _folder(tmp_path, irs[0], "fp32")
    for argument in (folder, folder / "fp32.bin", folder / "fp32.xml"):  # pre-commit passes either file
        rc, report = json_scan(capsys, str(argument))
        assert rc == 0 and report["findings"] == [], report["findings"]
        assert report["summary"]["files"] == 1


def test_nncf_style_integer_weights_are_quantized_not_dtype_errors(
        irs: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _folder(tmp_path, irs[0], "int8")
    with LocalFile(folder / "int8.xml") as source:
        assert scan_file(source).metadata["quantization"] == "nncf"
    rc, report = json_scan(capsys, str(folder))
    assert rc == 0 and report["findings"] == [], report["findings"]


def test_optimum_intel_style_folder(irs: tuple[Path, dict[str, Any]], tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    folder = shutil.copytree(irs[0] / "optimum", tmp_path / "optimum")
    rc, report = json_scan(capsys, str(folder))
    assert rc == 0 and report["findings"] == [], report["findings"]
    sets = sets_of(report, "optimum")
    assert set(sets) == {"model.safetensors", "openvino_model.xml"}
    assert sets["model.safetensors"]["primary"] and sets["openvino_model.xml"]["format"] == "openvino"
    (folder / "openvino_model.bin").write_bytes((folder / "openvino_model.bin").read_bytes()[:100])
    rc, report = json_scan(capsys, str(folder))
    assert rc == 1 and codes(report) == {"CG004"}  # truncated: its constants run past the end
    (folder / "openvino_model.bin").unlink()
    rc, report = json_scan(capsys, str(folder))
    assert rc == 1 and codes(report) == {"CG004"} and "missing" in report["findings"][0]["message"]


# ------------------------------------------------------------------ hostile XML

def _ir(layers: str, version: str = "11") -> bytes:
    return (f'<?xml version="1.0"?>\n<net name="m" version="{version}"><layers>{layers}</layers>'
            '<edges/></net>').encode()


def _const(offset: str = "0", size: str = "16", shape: str = "4", element: str = "f32", layer_id: str = "0") -> str:
    return (f'<layer id="{layer_id}" name="w" type="Const" version="opset1"><data element_type="{element}" '
            f'shape="{shape}" offset="{offset}" size="{size}"/><output><port id="0" precision="FP32" names="w">'
            '<dim>4</dim></port></output></layer>')


LAUGHS = ('<?xml version="1.0"?>\n<!DOCTYPE net [<!ENTITY a "aaaaaaaaaa">'
          + "".join(f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">' for i in range(9))
          + ']>\n<net name="&j;" version="11"><layers/></net>').encode()
EXTERNAL = (b'<?xml version="1.0"?>\n<!DOCTYPE net [<!ENTITY x SYSTEM "file:///etc/passwd">]>\n'
            b'<net name="&x;" version="11"><layers/></net>')


@pytest.mark.parametrize("data,contains", [
    (LAUGHS, "DOCTYPE declaration refused"),
    (EXTERNAL, "DOCTYPE declaration refused"),
    (b'<?xml version="1.0"?><net name="&x;" version="11"/>', "undefined entity"),
    (b"<net version='11'>" + b"<a>" * 10_000 + b"</a>" * 10_000 + b"</net>", "nest more than"),
    (_ir(_const())[:-20], "not well-formed"),
    (_ir(_const(offset=str(2**63))), "not a byte count"),
    (_ir(_const(size="8")), "short of the 16 bytes"),
    (_ir(_const(shape="4611686018427387904,4")), "overflows"),
    (_ir(_const(shape="-1")), "not a static size"),
    (_ir(_const() + _const()), "used twice"),
    (_ir(_const(), version="7"), "version '7'"),
    (b'<?xml version="1.0"?><html/>', "root element is <html>"),
    (b"\x00\x01garbage", "not well-formed"),
    (b"", "no element found"),
], ids=["billion-laughs", "external-entity", "undefined-entity", "deep-nesting", "truncated", "offset-2^63",
        "size-mismatch", "count-2^63", "dynamic-shape", "duplicate-id", "ir-v7", "not-an-ir", "binary", "empty"])
def test_hostile_xml_is_cg001_quickly(data: bytes, contains: str) -> None:
    assert_refused(data, "openvino_model.xml", contains)


def test_constants_past_the_end_of_a_bin_are_cg004_at_the_folder(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "openvino_model.xml").write_bytes(_ir(_const(offset=str(2**62))))
    (tmp_path / "openvino_model.bin").write_bytes(b"\0" * 16)
    rc, report = json_scan(capsys, str(tmp_path))
    assert rc == 1 and codes(report) == {"CG004"}


def test_a_valid_hand_made_ir_is_well_behaved() -> None:
    result = bounded_scan(_ir(_const(element="bf16", size="8") + _const(element="xyz", layer_id="1")), "m.xml")
    assert_well_behaved(result, b"")
    assert [t.dtype for t in result.scan.tensors] == ["BF16", "openvino:xyz"]
    assert [f.code for f in result.scan.findings] == ["CG005"]


def test_hub_scan_reads_irs_remotely_as_locally(irs: tuple[Path, dict[str, Any]], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("huggingface_hub")
    from hub_standin import standin_fixture
    from test_hub_scan import finding_keys, local_and_remote

    folder = shutil.copytree(irs[0] / "optimum", tmp_path / "repo")
    for name in ("compressed", "int8"):
        (folder / name).mkdir()
        for suffix in (".xml", ".bin"):
            shutil.copy(irs[0] / (name + suffix), folder / name / ("openvino_model" + suffix))
    for standin in standin_fixture(monkeypatch, tmp_path):
        rc_local, local, rc_remote, remote = local_and_remote(standin, folder, "org/ov", monkeypatch)
    assert rc_local == rc_remote == 1
    assert finding_keys(local, "repo") == finding_keys(remote, "org/ov") == {
        ("CG101", "compressed/openvino_model.bin", "self.fc1.weight")}
    assert sorted(str(m["dtypes"]) for m in local["models"]) == sorted(str(m["dtypes"]) for m in remote["models"])
    stats = {f["path"]: f for f in remote["extra"]["hub"]["repos"][0]["files"]}
    assert not any(name.endswith("openvino_model.bin") for name in stats)  # an IR's data is never fetched
    assert all(stats[name]["requests"] <= 2 for name in stats if name.endswith(".xml"))


# ------------------------------------------------------------------ differential: mutated IRs against read_model

# Documented disagreements (docs/reliability.md, OpenVINO IR).  A header scan reads the constants, the
# elements read_model refuses a file without, and the XML as XML; not the graph a runtime builds from them.
OV_GRAPH_NOT_CHECKED = re.compile(
    r"opset|operation with type|not a member of enum|Unsupported element type|find (input|output) port|"
    r"While validating node|stoll|stoi|stof|stod|Attribute .* (is|has)|Incorrect dimension|Cannot (create|get)|"
    r"doesn't contain|Invalid|not supported|is empty|dimension|mandatory attribute: (precision|external_port_id)|"
    r"not in graph|inconsistent|out of range|unordered_map")


def _reference_constants(pair: tuple[bytes, bytes]) -> list[list[Any]] | str:
    import tempfile

    from ir_package_writers import openvino_constants

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "m.xml").write_bytes(pair[0])
        Path(tmp, "m.bin").write_bytes(pair[1])
        try:
            return openvino_constants(str(Path(tmp, "m.xml")))
        except Exception as exc:  # noqa: BLE001 - the reference's refusal is the datum
            return "read_model: " + " ".join(str(exc).split())[:300]


def _our_constants(xml: bytes, data: bytes) -> list[list[Any]] | str:
    scan = scan_file(BytesSource(xml, name="m.xml"))
    problems = [f.message for f in scan.findings]
    if scan.format is None or problems:
        return "ours: " + " / ".join(problems)
    if any((t.data_end or 0) > len(data) for t in scan.tensors):
        return "ours: CG004 constants past the end of the .bin"
    return sorted([t.dtype, list(t.shape)] for t in scan.tensors)


def ov_verdict(ours: list[list[Any]] | str, theirs: list[list[Any]] | str) -> str | None:
    """'agree', a documented category, or None (a bug)."""
    if isinstance(ours, str) and isinstance(theirs, str):
        return "agree"
    if ours == theirs:
        return "agree"
    if isinstance(ours, str):
        return "stricter-xml" if "not well-formed" in ours else None
    if isinstance(theirs, str):
        return "graph-not-checked" if OV_GRAPH_NOT_CHECKED.search(theirs) else None
    remaining = Counter(map(repr, ours))
    remaining.subtract(map(repr, theirs))
    return "unreachable-not-listed" if min(remaining.values()) >= 0 else None


def test_mutated_irs_agree_with_read_model(irs: tuple[Path, dict[str, Any]]) -> None:
    import multiprocessing

    from fuzz_inputs import apply_all, random_mutations

    out = irs[0]
    pairs = [((out / n).read_bytes(), (out / n).with_suffix(".bin").read_bytes())
             for n in ("compressed.xml", "fp32.xml", "int8.xml", "loop.xml")]
    rng = random.Random(0)
    tally: Counter[str] = Counter()
    unexplained = []
    with multiprocessing.get_context("fork").Pool(1) as pool:  # a crash in the runtime is its refusal
        for i in range(MUTANTS):
            xml, data = pairs[i % len(pairs)]
            mutant = apply_all(xml, random_mutations(rng, xml, hot=len(xml)))
            ours = _our_constants(mutant, data)
            try:
                theirs = pool.apply_async(_reference_constants, ((mutant, data),)).get(30)
            except multiprocessing.TimeoutError:
                theirs = "read_model: no answer"
            category = ov_verdict(ours, theirs)
            tally[category or "UNEXPLAINED"] += 1
            if category is None:
                unexplained.append((mutant[:200], ours, theirs))
    assert not unexplained, unexplained[:3]
    assert tally["agree"] / MUTANTS >= 0.9, tally
