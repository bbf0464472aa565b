"""convert's streaming parts: the tiled transpose, the band writer, and what CG301 verification catches."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
ml_dtypes = pytest.importorskip("ml_dtypes")
from guard import dtypes  # noqa: E402
from guard.write import transpose  # noqa: E402
from guard.write.bitviews import numpy_dtype  # noqa: E402
from guard.write.transpose import bit_view, permuted_bands, permuted_shape, reduce_perm  # noqa: E402

CODES = sorted(code for code, info in dtypes.DTYPES.items() if info.numpy and info.bits >= 8)


def random_bits(shape: tuple[int, ...], code: str, rng: np.random.Generator) -> np.ndarray:
    """Every bit pattern is fair game (NaNs with payloads, subnormals, -0); bool stays 0/1."""
    dtype = numpy_dtype(code)
    count = int(np.prod(shape, dtype=np.int64))
    if code == "BOOL":
        return rng.integers(0, 2, size=shape).astype(bool)
    raw = rng.integers(0, 256, size=count * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def permute(a: np.ndarray, perm: tuple[int, ...] | None) -> np.ndarray:
    """``a.transpose(perm)`` through the converter's bands, gathered into one new array."""
    out = np.empty(permuted_shape(a.shape, perm), a.dtype)
    flat = bit_view(out).reshape(-1)
    done = 0
    for band in permuted_bands(a, perm, lambda n: flat[done:done + n]):  # noqa: B023 (reads done as the loop advances it)
        done += band.size
    return out


@pytest.mark.parametrize("code", CODES)
def test_permute_is_numpy_transpose_bit_for_bit(code: str) -> None:
    rng = np.random.default_rng(len(code))
    for rank in range(6):
        for perm in itertools.permutations(range(rank)):
            shape = tuple(int(d) for d in rng.integers(1, 6, size=rank))
            a = random_bits(shape, code, rng)
            assert same_bits(permute(a, perm), a.transpose(perm).copy()), (shape, perm)


@pytest.mark.parametrize("shape, perm", [
    ((1031, 517), (1, 0)),  # odd sizes: partial tiles on both axes
    ((3, 257, 129), (0, 2, 1)),  # a batch of matrices
    ((64, 3, 5, 7), (2, 3, 1, 0)),  # Conv2d [O, I, kH, kW] -> Flax [kH, kW, I, O]
    ((7, 5, 64, 3), (3, 2, 0, 1)),  # and back
    ((9, 1, 513), (2, 1, 0)),  # a length-1 axis between
    ((5, 0, 3), (2, 1, 0)),  # zero-size
    ((), ()),  # 0-d stays 0-d (ascontiguousarray would make it [1])
])
@pytest.mark.parametrize("code", ["BF16", "F32", "U8", "F64"])
@pytest.mark.parametrize("split", [False, True], ids=["one-thread", "two-threads"])
def test_permute_in_small_bands(monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...], perm: tuple[int, ...],
                                code: str, split: bool) -> None:
    monkeypatch.setattr(transpose, "BAND_BYTES", 4096)  # many bands, each smaller than a tile
    monkeypatch.setattr(transpose, "MIN_BAND_ROWS", 3)
    monkeypatch.setattr(transpose, "SPLIT_BYTES", 1 if split else 2**62)  # the helper fills half of each band
    monkeypatch.setattr(transpose, "SPLIT_CPUS", 1)  # whatever this machine has
    a = random_bits(shape, code, np.random.default_rng(1))
    assert same_bits(permute(a, perm), a.transpose(perm).copy())


@pytest.mark.parametrize("cpus, helper_used", [(2, False), (3, True)])
def test_the_helper_thread_only_where_the_writer_keeps_a_core(monkeypatch: pytest.MonkeyPatch, cpus: int,
                                                               helper_used: bool) -> None:
    import threading

    threads: set[str] = set()
    fill = transpose._fill

    def recording_fill(*args: object) -> None:
        threads.add(threading.current_thread().name)
        fill(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(transpose, "_fill", recording_fill)
    monkeypatch.setattr(transpose, "usable_cpus", lambda: cpus)
    a = random_bits((2048, 1024), "BF16", np.random.default_rng(2))  # 4 MiB: bands above SPLIT_BYTES
    assert same_bits(permute(a, (1, 0)), a.T.copy())
    assert any(name.startswith("ckpt-guard-transpose") for name in threads) is helper_used, threads


def test_nan_payloads_survive_a_transpose() -> None:
    bf16 = np.array([[0x7F81, 0xFFFF, 0x7FC0], [0xFF81, 0x0001, 0x8000]], np.uint16).view(ml_dtypes.bfloat16)
    f32 = np.array([[0x7F800001, 0xFFC00001], [0x7FBFFFFF, 0x80000000]], np.uint32).view(np.float32)
    for a in (bf16, f32):
        out = permute(a, (1, 0))
        assert out.view(f"u{a.itemsize}").tolist() == a.view(f"u{a.itemsize}").T.tolist()


@pytest.mark.parametrize("shape, perm, want", [
    ((8, 4, 3, 3), (2, 3, 1, 0), ((8, 4, 9), (2, 1, 0))),
    ((3, 3, 4, 8), (3, 2, 0, 1), ((9, 4, 8), (2, 1, 0))),
    ((2048, 5504), (1, 0), ((2048, 5504), (1, 0))),
    ((1, 16), (1, 0), ((16,), (0,))),  # nothing moves
    ((4, 5, 6), (0, 2, 1), ((4, 5, 6), (0, 2, 1))),
    ((4, 5, 6), (1, 2, 0), ((4, 30), (1, 0))),
])
def test_reduce_perm(shape: tuple[int, ...], perm: tuple[int, ...], want: tuple) -> None:  # type: ignore[type-arg]
    assert reduce_perm(shape, perm) == want


# ------------------------------------------------------------------ the band writer and CG301

def source_model(tmp_path: Path, arrays: dict[str, np.ndarray]):  # type: ignore[no-untyped-def]
    """A model.safetensors written by the safetensors library, opened as convert opens a source."""
    from safetensors.numpy import save_file

    from guard.convert.read.source import open_source

    src = tmp_path / "src"
    src.mkdir()
    save_file(arrays, src / "model.safetensors", metadata={"format": "pt"})
    return open_source(src, to="flax")


def plan(model, perms: dict[str, tuple[int, ...] | None],  # type: ignore[no-untyped-def]
         casts: dict[str, str] | None = None):
    from guard.write.plan import Mapped
    from guard.write.writer import OutputTensor

    out = []
    for tensor in model.tensors:
        mapped = Mapped(tensor, tuple(tensor.name.split(".")), perms.get(tensor.name))
        out.append(OutputTensor(mapped, "/".join(mapped.target), (casts or {}).get(tensor.name, tensor.info.dtype)))
    return out


def arrays_for_writer(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "a.kernel": random_bits((37, 301), "BF16", rng),  # transposed, in bands, across chunk boundaries
        "a.embedding": random_bits((53, 19), "F16", rng),  # a plain range copy, split by chunks
        "b.scale": random_bits((7,), "F32", rng),
        "b.conv": random_bits((6, 3, 3, 2), "F32", rng),
        "c.ids": rng.integers(-5, 5, size=(4, 4)).astype(np.int64),
        "c.flag": np.array([True, False, True]),
        "c.scalar": random_bits((), "F32", rng),
    }


PERMS = {"a.kernel": (1, 0), "b.conv": (2, 3, 1, 0)}


@pytest.mark.parametrize("chunk", [2**30, 1000])
def test_streamed_msgpack_is_what_flax_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    pytest.importorskip("flax")
    import msgpack
    from flax.serialization import msgpack_restore
    from flax.traverse_util import flatten_dict

    from guard.write import framing, produce
    from guard.write.verify import verify_output
    from guard.write.writer import write_output

    monkeypatch.setattr(framing, "MAX_CHUNK_SIZE", chunk)  # 1000: every big leaf becomes flax's chunked map
    monkeypatch.setattr(transpose, "BAND_BYTES", 2048)
    monkeypatch.setattr(produce, "BAND_BYTES", 2048)
    arrays = arrays_for_writer(np.random.default_rng(7))
    outputs = plan(source_model(tmp_path, arrays), PERMS)
    out = tmp_path / "out"
    out.mkdir()
    written = write_output(out, [outputs], layout="msgpack", checksum=True)
    assert verify_output(out, outputs, written, layout="msgpack", full=True) == ([], len(arrays))
    raw = (out / "flax_model.msgpack").read_bytes()
    assert msgpack.unpackb(raw, strict_map_key=False)  # plain msgpack too
    restored = flatten_dict(msgpack_restore(raw))
    assert set(restored) == {tuple(n.split(".")) for n in arrays}
    for name, array in arrays.items():
        want = array.transpose(PERMS[name]) if name in PERMS else array
        assert same_bits(np.asarray(restored[tuple(name.split("."))]), want.copy()), name


def test_casts_stream_in_bands_and_count_overflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from guard.write import produce
    from guard.write.verify import verify_output
    from guard.write.writer import write_output

    monkeypatch.setattr(transpose, "BAND_BYTES", 512)
    monkeypatch.setattr(produce, "BAND_BYTES", 512)
    big = np.linspace(-1e5, 1e5, 40 * 30, dtype=np.float32).reshape(40, 30)  # 2 x 4 of these overflow fp16 ...
    arrays = {"w.kernel": big, "w.bias": np.arange(9, dtype=np.float32)}
    outputs = plan(source_model(tmp_path, arrays), {"w.kernel": (1, 0)}, {"w.kernel": "F16", "w.bias": "BF16"})
    (tmp_path / "out").mkdir()
    written = write_output(tmp_path / "out", [outputs], layout="safetensors")
    [finding] = written.cast_findings
    assert finding.code == "CG201" and finding.tensor == "w/kernel"
    assert finding.message.startswith(f"{int(np.count_nonzero(np.abs(big) > 65504))} value(s) overflow")
    assert verify_output(tmp_path / "out", outputs, written, layout="safetensors")[0] == []
    from safetensors.numpy import load_file

    back = load_file(tmp_path / "out" / "model.safetensors")
    with np.errstate(over="ignore"):
        assert same_bits(back["w/kernel"], big.T.astype(np.float16))
    assert same_bits(back["w/bias"], arrays["w.bias"].astype(ml_dtypes.bfloat16))


def test_verification_catches_a_wrong_transpose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from guard.write import produce
    from guard.write.verify import verify_output
    from guard.write.writer import write_output

    real = produce.permuted_bands

    def off_by_one(a, perm, buffer):  # type: ignore[no-untyped-def]
        for band in real(a, perm, buffer):
            band[0] ^= 1  # one flipped bit at the start of every band: a bug in the transposing copy
            yield band

    monkeypatch.setattr(produce, "permuted_bands", off_by_one)
    arrays = arrays_for_writer(np.random.default_rng(3))
    outputs = plan(source_model(tmp_path, arrays), PERMS)
    (tmp_path / "out").mkdir()
    written = write_output(tmp_path / "out", [outputs], layout="safetensors")
    findings, _ = verify_output(tmp_path / "out", outputs, written, layout="safetensors")
    assert {(f.code, f.tensor) for f in findings} == {("CG301", "a/kernel"), ("CG301", "b/conv")}
    kernel = next(f for f in findings if f.tensor == "a/kernel")
    assert "element [0, 0] reads" in kernel.message and "the source a.kernel holds" in kernel.message


def test_full_verification_catches_what_sampling_skips(tmp_path: Path) -> None:
    from guard.write.verify import verify_output
    from guard.write.writer import write_output

    arrays = {"x.embedding": np.zeros((1000,), np.float32)}
    outputs = plan(source_model(tmp_path, arrays), {})
    out = tmp_path / "out"
    out.mkdir()
    written = write_output(out, [outputs], layout="safetensors", checksum=True)
    [(_file, start, _length)] = written.places["x/embedding"]
    path = out / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[start + 4 * 500 + 1] ^= 0xFF  # element 500 is not among the sampled ones (first, last, 30 picked)
    path.write_bytes(bytes(data))
    assert verify_output(out, outputs, written, layout="safetensors")[0] == []  # what sampling means
    [finding] = verify_output(out, outputs, written, layout="safetensors", full=True)[0]
    assert finding.code == "CG301" and "CRC32" in finding.message


def test_a_short_read_is_cg301_never_padded(tmp_path: Path) -> None:
    """A source truncated after the write: its missing zeros must not read back as zeros."""
    from guard.write.verify import verify_output
    from guard.write.writer import write_output

    arrays = {"x.a": np.ones((4,), np.float32), "x.b": np.zeros((1000,), np.float32)}
    outputs = plan(source_model(tmp_path, arrays), {})
    out = tmp_path / "out"
    out.mkdir()
    written = write_output(out, [outputs], layout="safetensors")
    assert verify_output(out, outputs, written, layout="safetensors")[0] == []
    source = tmp_path / "src" / "model.safetensors"
    os.truncate(source, source.stat().st_size - 4 * 500)  # the second half of x.b's zeros
    [finding] = verify_output(out, outputs, written, layout="safetensors")[0]
    assert finding.code == "CG301" and finding.tensor == "x/b"
    assert "model.safetensors ends before element" in finding.message


def test_misplaced_bytes_are_cg301(tmp_path: Path) -> None:
    from guard.write.verify import verify_output
    from guard.write.writer import write_output

    arrays = {"x.a": np.ones((4,), np.float32), "x.b": np.zeros((4,), np.float32)}
    outputs = plan(source_model(tmp_path, arrays), {})
    (tmp_path / "out").mkdir()
    written = write_output(tmp_path / "out", [outputs], layout="safetensors")
    file, start, length = written.places["x/b"][0]
    written.places["x/b"] = [(file, start - 16, length)]  # as if the writer had framed it 16 bytes early
    [finding] = verify_output(tmp_path / "out", outputs, written, layout="safetensors")[0]
    assert finding.tensor == "x/b" and "not where they were written" in finding.message


def test_reads_without_mmap_give_the_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from guard.write import produce
    from guard.write.verify import verify_output
    from guard.write.writer import write_output

    arrays = arrays_for_writer(np.random.default_rng(5))
    outputs = plan(source_model(tmp_path, arrays), PERMS)
    for name, mapped in (("mapped", produce._mapped), ("read", None)):
        if mapped is None:
            def refuse(*_args: object) -> None:
                raise OSError(19, "No such device")  # what mmap says for a pipe or an odd file system

            monkeypatch.setattr(produce, "_mapped", refuse)
        out = tmp_path / name
        out.mkdir()
        written = write_output(out, [outputs], layout="safetensors")
        assert verify_output(out, outputs, written, layout="safetensors")[0] == []
    mapped, read = ((tmp_path / name / "model.safetensors").read_bytes() for name in ("mapped", "read"))
    assert mapped == read


@pytest.mark.parametrize("perms", [{}, PERMS], ids=["copied", "transposed"])
def test_a_source_deleted_mid_conversion_is_one_guard_error(tmp_path: Path,
                                                            perms: dict) -> None:  # type: ignore[type-arg]
    from guard.errors import GuardError
    from guard.write.writer import write_output

    arrays = arrays_for_writer(np.random.default_rng(2))
    outputs = plan(source_model(tmp_path, arrays), perms)
    (tmp_path / "src" / "model.safetensors").unlink()  # after planning, before any tensor is read
    (tmp_path / "out").mkdir()
    with pytest.raises(GuardError, match=r"model\.safetensors: cannot read .*; nothing written"):
        write_output(tmp_path / "out", [outputs], layout="safetensors")


@pytest.mark.parametrize("code, torch_dtype", [("BF16", "bfloat16"), ("F16", "float16")])
def test_fp64_narrows_as_torch_does_through_float(code: str, torch_dtype: str) -> None:
    """torch builds a half or bfloat16 from a float: fp64 rounds to fp32 first, then to 16 bits (twice).
    numpy (and ml_dtypes 0.7 for bf16) round once, which differs on values just past a tie."""
    import numpy as np

    torch = pytest.importorskip("torch")
    from guard.write.cast import CastCheck

    ties = [1 + 2.0**-8 + 2.0**-40, 1 + 2.0**-11 + 2.0**-40, 1 + 3 * 2.0**-9 + 2.0**-45]
    rng = np.random.default_rng(0)
    values = np.concatenate([ties, -np.array(ties), rng.standard_normal(4096) * 1e3,
                             [65519.99, 65520.0, 1e300, -1e-9, 0.0, -0.0, np.inf, np.nan]]).astype(np.float64)
    check = CastCheck(code)
    ours = check.cast(values).view(np.uint16)
    theirs = torch.from_numpy(values).to(getattr(torch, torch_dtype)).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(ours, theirs)
    assert check.count == (2 if code == "F16" else 1)  # 1e300 (and 65520 in fp16) become inf: CG201
