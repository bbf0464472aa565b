"""GGUF, ONNX and NumPy for the fuzz machinery of ``fuzz_inputs``: samples, references, known cases.

Not a test module.  ``fuzz_inputs`` registers these next to its own formats, so
the differential tests, the seed corpus and the agreement figures cover them the
same way.  Samples are written by the real libraries (gguf's GGUFWriter, onnx,
numpy); the references are the libraries' own readers: ``gguf.GGUFReader``,
``onnx.load`` plus ``numpy_helper.to_array`` on every inline tensor of every weight
``onnx_reference.onnx_weights`` walks (initializers, Constant nodes, subgraphs, functions), and
``numpy.load`` (``mmap_mode="r"`` for ``.npy``; every array of an ``.npz``).
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

Inventory = dict[str, tuple[str, tuple[int, ...]]]

FILE_NAMES_A = {"gguf": "model.gguf", "onnx": "model.onnx", "npy": "weights.npy", "npz": "weights.npz"}
FORMATS_A = tuple(FILE_NAMES_A)
REFERENCE_SECONDS = 2.0  # a reference still parsing after this is counted as refusing (a hang)


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def _scratch(data: bytes, suffix: str) -> Iterator[str]:
    fd, path = tempfile.mkstemp(suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        yield path
    finally:
        os.unlink(path)


# ------------------------------------------------------------------ references

def _bounded_gguf_reader() -> type:
    """GGUFReader, except that a read wholly past the end of the file raises.

    gguf-py slices its memmap past the end into empty arrays of size 0, so a mutated array or
    key count (up to 2^64) makes it loop without advancing, allocating as it goes.  The alarm
    below ends that loop in a short process, but in the whole suite's process (4 GB, 25 threads)
    it did not: the loop took the machine's memory (CI killed for it, reproduced at 16 GB here).
    Every file that the real reader accepts reads the same through this one.
    """
    from gguf import GGUFReader

    class BoundedGGUFReader(GGUFReader):  # type: ignore[misc]
        def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> Any:
            if int(count) > 0 and offset >= len(self.data):
                raise EOFError(f"read of {int(count)} item(s) at offset {offset}, past the end of the file")
            return super()._get(offset, dtype, count, override_order)

    return BoundedGGUFReader


def reference_gguf(data: bytes) -> Inventory | str:
    from bounds import no_hang

    reader_class = _bounded_gguf_reader()
    for path in _scratch(data, ".gguf"):
        try:
            with no_hang(REFERENCE_SECONDS):  # any other loop over a count it never checks
                reader = reader_class(path)
            out = {t.name: (t.tensor_type.name, tuple(int(d) for d in reversed(t.shape.tolist())))
                   for t in reader.tensors}
            del reader  # release the memmap before the file goes
            return out
        except Exception as exc:  # noqa: BLE001 - the reference's refusal is the datum we record
            return f"GGUFReader: {_first_line(exc)}"
    raise AssertionError("unreachable")


def reference_onnx(data: bytes) -> Inventory | str:
    import onnx
    from onnx import numpy_helper
    from onnx_reference import onnx_weights

    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:  # noqa: BLE001
        return f"onnx.load: {_first_line(exc)}"
    try:  # every weight: initializers, Constant nodes, subgraphs, functions; each inline one through to_array
        weights = onnx_weights(model, check=lambda t: t.data_location == onnx.TensorProto.EXTERNAL
                               or numpy_helper.to_array(t))
    except Exception as exc:  # noqa: BLE001
        return f"to_array: {_first_line(exc)}"
    return {name: (code, shape) for name, code, shape in weights}


def numpy_code(dtype: Any) -> str:
    from guard.dtypes import NUMPY_NAMES

    if dtype.names is not None or dtype.subdtype is not None:
        return "structured"
    if dtype.kind in "VSU":
        return f"{dtype.kind}{dtype.itemsize // (4 if dtype.kind == 'U' else 1)}"
    if dtype.kind in "Mm":
        return "datetime64" if dtype.kind == "M" else "timedelta64"
    name = dtype.newbyteorder("=").name
    return {"complex128": "C128", "float128": "float128", "complex256": "complex256"}.get(
        name, NUMPY_NAMES.get(name, name))


def reference_npy(data: bytes) -> Inventory | str:
    import numpy as np

    for path in _scratch(data, ".npy"):
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
            out = {"weights": (numpy_code(array.dtype), tuple(array.shape))}
            del array
            return out
        except Exception as exc:  # noqa: BLE001
            return f"numpy.load: {_first_line(exc)}"
    raise AssertionError("unreachable")


def reference_npz(data: bytes) -> Inventory | str:
    import numpy as np

    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            out = {}
            for key in npz.files:
                value = npz[key]
                if isinstance(value, np.ndarray):
                    out[key] = (numpy_code(value.dtype), tuple(value.shape))
            return out
    except Exception as exc:  # noqa: BLE001
        return f"numpy.load: {_first_line(exc)}"


REFERENCES_A: dict[str, Callable[[bytes], Inventory | str]] = {
    "gguf": reference_gguf, "onnx": reference_onnx, "npy": reference_npy, "npz": reference_npz,
}


# ------------------------------------------------------------------ samples (real writers)

def write_gguf(path: str | os.PathLike[str], build: Callable[[Any], None], **kwargs: Any) -> Path:
    """A GGUF file written the way llama.cpp's converters write one: gguf's GGUFWriter, ``build`` adding to it."""
    from gguf import GGUFWriter

    writer = GGUFWriter(path, "llama", **kwargs)
    build(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def _gguf_samples() -> list[bytes]:
    import ml_dtypes
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFEndian
    from gguf.quants import quantize

    def write(build: Callable[[Any], None], **kwargs: Any) -> bytes:
        with tempfile.TemporaryDirectory() as tmp:
            return write_gguf(os.path.join(tmp, "m.gguf"), build, **kwargs).read_bytes()

    rng = np.random.default_rng(0)

    def f16(w: Any) -> None:
        w.add_file_type(1)
        w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(12)])
        w.add_array("tokenizer.ggml.scores", [0.5] * 4)
        w.add_uint32("llama.context_length", 64)
        w.add_tensor("token_embd.weight", rng.standard_normal((6, 8)).astype(np.float16))
        w.add_tensor("blk.0.attn_norm.weight", np.ones(8, np.float32))

    def q8(w: Any) -> None:
        w.add_file_type(7)
        w.add_quantization_version(2)
        w.add_custom_alignment(64)
        q = quantize(rng.standard_normal((2, 64)).astype(np.float32), GGMLQuantizationType.Q8_0)
        w.add_tensor("blk.0.ffn_up.weight", q, raw_shape=q.shape, raw_dtype=GGMLQuantizationType.Q8_0)
        w.add_tensor("output_norm.weight", np.ones(4, np.float32))
        w.add_array("nested", [[1, 2], [3]])

    def bf16(w: Any) -> None:
        w.add_file_type(32)
        bf = np.ones((3, 4), np.float32).astype(ml_dtypes.bfloat16).view(np.uint8)
        w.add_tensor("blk.0.attn_q.weight", bf, raw_dtype=GGMLQuantizationType.BF16, raw_shape=bf.shape)
        w.add_tensor("positions", np.arange(5, dtype=np.int32))
        w.add_tensor("f64", np.zeros(2, np.float64))
        w.add_bool("general.flag", True)
        w.add_string("general.name", "tiny")

    def split(w: Any) -> None:
        w.add_uint16("split.no", 0)
        w.add_uint16("split.count", 2)
        w.add_int32("split.tensors.count", 3)
        w.add_tensor("a", np.ones((2, 2), np.float32))

    return [write(f16), write(q8), write(bf16), write(split, endianess=GGUFEndian.BIG)]


def _onnx_samples() -> list[bytes]:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "w")
    h = numpy_helper.from_array(np.ones(4, np.float16), "h")
    ids = numpy_helper.from_array(np.arange(3, dtype=np.int64), "ids")
    then_init = numpy_helper.from_array(np.ones(2, np.float32), "then_c")
    else_init = numpy_helper.from_array(np.zeros(2, np.float32), "else_c")
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    then_g = helper.make_graph([helper.make_node("Identity", ["then_c"], ["y"])], "then", [], [out],
                               [then_init])
    else_g = helper.make_graph([helper.make_node("Identity", ["else_c"], ["y"])], "else", [], [out],
                               [else_init])
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    if_node = helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)
    g1 = helper.make_graph([if_node], "g", [cond], [out], [w, h, ids])
    m1 = helper.make_model(g1, opset_imports=[helper.make_opsetid("", 17)])

    typed = [helper.make_tensor("f", TensorProto.FLOAT, [2], [1.0, 2.0]),
             helper.make_tensor("half", TensorProto.FLOAT16, [2], np.ones(2, np.float16).view(np.uint16)),
             helper.make_tensor("i64", TensorProto.INT64, [3], [1, -2, 3]),
             helper.make_tensor("s", TensorProto.STRING, [1], [b"x"]),
             helper.make_tensor("d", TensorProto.DOUBLE, [1], [0.5])]
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.ones(2, np.float32), "sp"),
                                       numpy_helper.from_array(np.array([0, 3], np.int64), "sp_i"), [4])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2])
    g2 = helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "typed", [x],
                           [helper.make_tensor_value_info("z", TensorProto.FLOAT16, [2])], typed,
                           sparse_initializer=[sparse])
    m2 = helper.make_model(g2, producer_name="tests")

    m3 = helper.make_model(helper.make_graph([], "ext", [], [], [numpy_helper.from_array(
        np.ones((4, 4), np.float32), "big")]))
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(m3, os.path.join(tmp, "e.onnx"), save_as_external_data=True, location="e.onnx_data",
                  size_threshold=0)
        with open(os.path.join(tmp, "e.onnx"), "rb") as fh:
            external = fh.read()
    return [m1.SerializeToString(), m2.SerializeToString(), external, _onnx_constant_sample()]


def _onnx_constant_sample() -> bytes:
    """paddle2onnx's layout: every weight a Constant node, here also in an If branch and a function."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    def const(name: str, array: Any, **attrs: Any) -> Any:
        if array is None:
            return helper.make_node("Constant", [], [name], **attrs)
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, ""))

    out = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2])
    branch = helper.make_graph([const("bw", np.ones(2, np.float16)), helper.make_node("Identity", ["bw"], ["y"])],
                               "then", [], [out])
    nodes = [const("conv.w", np.arange(6, dtype=np.float16).reshape(2, 3)), const("ids", np.arange(2)),
             const("eps", None, value_float=1e-5), const("perm", None, value_ints=[1, 0]),
             helper.make_node("If", ["cond"], ["y"], name="If_0", then_branch=branch, else_branch=branch),
             helper.make_node("Dense", ["y"], ["z"], domain="custom")]
    function = helper.make_function("custom", "Dense", ["x"], ["z"], [
        const("fw", np.ones(2, np.float32)), helper.make_node("Add", ["x", "fw"], ["z"])],
        [helper.make_opsetid("", 17)])
    graph = helper.make_graph(nodes, "paddle", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT16, [2])])
    return helper.make_model(graph, functions=[function], opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)]).SerializeToString()


def _npy_samples() -> list[bytes]:
    import ml_dtypes
    import numpy as np

    out = []
    for array in (np.arange(12, dtype=np.float32).reshape(3, 4), np.asfortranarray(np.ones((2, 3))),
                  np.ones(3, ml_dtypes.bfloat16), np.array([True, False]), np.ones(2, ">i4")):
        buf = io.BytesIO()
        np.save(buf, array)
        out.append(buf.getvalue())
    return out


def _npz_samples() -> list[bytes]:
    import numpy as np

    out = []
    arrays = {"embed": np.ones((3, 4), np.float16), "ids": np.arange(4), "flag": np.array(True)}
    for save in (np.savez, np.savez_compressed):
        buf = io.BytesIO()
        save(buf, **arrays)
        out.append(buf.getvalue())
    return out


SAMPLERS_A: dict[str, Callable[[], list[bytes]]] = {
    "gguf": _gguf_samples, "onnx": _onnx_samples, "npy": _npy_samples, "npz": _npz_samples,
}


# (category, formats, we accept, pattern): Known records of fuzz_inputs; docs/reliability.md explains each
KNOWN_A: tuple[tuple[str, tuple[str, ...], bool, str], ...] = (
    # a GGUF type outside ggml's registry or with no block size is CG009 (an error: llama.cpp refuses the file), read
    # all the same; GGUFReader raises ("... is not a valid GGMLQuantizationType")
    ("unknown-dtype", FORMATS_A, True, r"^CG00[59]$"),
    # llama.cpp's layout rules (gguf.cpp): tensors follow one another at aligned offsets, at most
    # 4 dims, alignment up to 1 MiB; GGUFReader checks none of them.  Arrays nested deeper than 8.
    ("ggml-layout", ("gguf",), False,
     r"has data offset|dims; ggml allows|power of two up to|arrays nested more than"),
    # External tensors: the reference does not load their data (load_external_data=False), so
    # to_array never sees them; we check their entries (location, offset, length) against the dims.
    ("external-data-checked", ("onnx",), False, r"^unreadable checkpoint: external (initializer|Constant)"),
    # to_array truncates packed 4-bit, 2-bit and 6-bit raw_data (or int32_data) that is longer than
    # the dims need; the spec sizes them exactly, and so do we.
    ("packed-size", ("onnx",), False, r"(raw_data of .* bytes is not the .* bytes|holds .* values, not the .*) "
                                       r"of (I4|U4|F4|I2|U2|F6_E2M3|F6_E3M2)\["),
    # to_array reads a STRING tensor's string_data and ignores its raw_data, which the spec forbids
    # for strings (so does ONNX Runtime); it decodes each string as UTF-8, which we never read.
    ("strings-not-decoded", ("onnx",), False, r"strings cannot be raw_data"),
    ("strings-not-decoded", ("onnx",), True, r"^to_array: UnicodeDecodeError"),
    # onnx.load keeps two initializers of one graph with one name (onnx.checker refuses them, and
    # a runtime can bind only one): we refuse the file.
    ("duplicate-initializer", ("onnx",), False, r"is defined twice in one graph"),
    # numpy.dtype reads spellings np.save never writes ('<V,' is a record format list); we read
    # the descriptors numpy writes and their one-letter forms.
    ("descr-spellings", ("npy", "npz"), False, r"descr .* is not a dtype numpy knows"),
    # protobuf reads any bytes without a graph field (an empty file too) as a model with no graph.
    ("empty-model", ("onnx",), False, r"has no graph"),
    # Python's zipfile, like miniz for torch, takes the last EOCD signature it finds and reads a
    # central directory that overruns its declared size; it takes bytes between the directory and
    # the end record for bytes prepended to the archive and moves every offset by them (an end
    # record that now places an empty directory there: numpy.load returns no array at all).
    # We refuse a zip whose records disagree.
    ("stricter-zip", ("npz",), False,
     r"End Of Central Directory|runs past the directory|does not fit|zip64|multi-disk|overlaps"
     r"|two different sizes|stray bytes between the zip directory"),
    # Headers, not data: the CRC of a member's bytes is checked only by reading them all.
    ("data-not-read", ("npz",), True, r"Bad CRC-32|Error -3 while decompressing"),
)


def hot_region_a(fmt: str, data: bytes) -> int | None:
    """Leading bytes that hold a GGUF or .npy header (mutations aim there half the time)."""
    from guard.readers import scan_file
    from guard.sources import BytesSource

    if fmt not in ("gguf", "npy"):
        return None
    scan = scan_file(BytesSource(data, name=FILE_NAMES_A[fmt]))
    starts = [t.data_start for t in scan.tensors if t.data_start is not None]
    return min(starts) if starts else len(data)
