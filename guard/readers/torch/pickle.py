"""A static walker for torch pickles: it builds descriptions, never objects.

Nothing here imports a module named in a pickle, calls ``find_class`` or runs
``pickle.load``.  Each opcode moves *descriptions* (``Global``, ``StorageRef``,
``TensorRef``, plain containers) on a bounded stack; a global outside
``ALLOWED_GLOBALS`` is recorded by name (CG003) and whatever it would have built
becomes an inert ``Unsafe`` marker.
"""

from __future__ import annotations

import pickletools
import re
from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING  # pure data tables, as pickle uses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from guard.errors import MalformedCheckpoint

# A torch data.pkl costs ~200 bytes per tensor: 256 MiB is >1M tensors, far past any
# real checkpoint, yet small enough to hold in memory on a CI runner.
MAX_PICKLE_BYTES = 256 * 1024 * 1024
MAX_STACK = 1_000_000  # items on the stack at once (SETITEMS batches hold 2,000)
MAX_MARKS = 1_000  # open MARKs; state dicts nest a handful deep
MAX_MEMO = 4_000_000  # memo slots: ~5 per tensor
MAX_NESTING = 200  # container depth when naming tensors
MAX_LINE = 64 * 1024  # a protocol-0 text argument (GLOBAL module name, INT digits)
_SCRIPT_NAME = re.compile(r"[A-Za-z0-9_.]*")  # the bytes torch.jit's unpickler takes in a GLOBAL line
MAX_DIMS = 1_000

# Storage classes (torch.X and torch.cuda.X) -> torch dtype name.
STORAGE_DTYPES: dict[str, str] = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
    "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128", "QInt8Storage": "qint8", "QUInt8Storage": "quint8",
    "QInt32Storage": "qint32", "QUInt4x2Storage": "quint4x2", "QUInt2x4Storage": "quint2x4",
}
# torch dtype name -> bytes per element (torch's ``dtype.itemsize``).
ITEMSIZES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
    "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "uint16": 2, "uint32": 4, "uint64": 8,
    "complex32": 4, "complex64": 8, "complex128": 16, "qint8": 1, "quint8": 1, "qint32": 4,
    "quint4x2": 1, "quint2x4": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1, "bits8": 1, "bits16": 2,
    "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
    **{f"{sign}int{bits}": 1 for sign in ("", "u") for bits in range(1, 8)},
}
_REBUILDERS = (
    "_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
    "_rebuild_parameter_with_state", "_rebuild_qtensor", "_rebuild_sparse_tensor",
    "_rebuild_nested_tensor", "_rebuild_meta_tensor_no_storage",
    "_rebuild_device_tensor_from_cpu_tensor", "_rebuild_device_tensor_from_numpy",
    "_rebuild_wrapper_subclass",
)
_TENSOR_TYPES = ("Double", "Float", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool")
_UNTYPED_STORAGES = ("torch.storage.UntypedStorage", "torch.storage.TypedStorage")
# TorchScript's pickler tags lists and dicts with their static type through these
# (torch/jit/_pickle.py); each returns its first argument unchanged.
SCRIPT_PASS_THROUGH = frozenset(f"torch.jit._pickle.{name}" for name in (
    "restore_type_tag", "build_intlist", "build_tensorlist", "build_doublelist", "build_boollist"))

# Mirrors torch._weights_only_unpickler._get_allowed_globals (torch 2.13); a test
# checks this is a subset of torch's own list.
ALLOWED_GLOBALS: frozenset[str] = frozenset({
    "collections.OrderedDict", "collections.Counter", "torch.nn.parameter.Parameter",
    "torch.serialization._get_layout", "torch.Size", "torch.Tensor", "torch.device",
    "_codecs.encode", "builtins.bytearray", "builtins.set", "builtins.complex",
    "torch._tensor._rebuild_from_type_v2", *_UNTYPED_STORAGES,
    "torch.per_tensor_affine", "torch.per_tensor_symmetric", "torch.per_channel_affine",
    "torch.per_channel_symmetric", "torch.per_channel_affine_float_qparams",
    *(f"torch.{name}" for name in ITEMSIZES),
    *(f"torch._utils.{name}" for name in _REBUILDERS),
    *(f"{mod}.{name}" for mod in ("torch", "torch.cuda") for name in STORAGE_DTYPES
      if mod == "torch" or not name.startswith("Q")),
    *(f"{mod}.{t}Tensor" for mod in ("torch", "torch.cuda") for t in _TENSOR_TYPES),
    *(f"{mod}.{t}Tensor" for mod in ("torch.sparse", "torch.cuda.sparse") for t in _TENSOR_TYPES
      if t != "Bool"),
})

# torchao's quantized weights are tensor subclasses that torchao registers with torch's
# weights-only unpickler (``add_safe_globals``).  Here they are read as *descriptions*: the class
# names a layout, its ``_rebuild_wrapper_subclass`` arguments give the logical shape and dtype,
# and its state dict holds plain tensors (qdata, scale, zero_point).  Nothing is imported.
_TORCHAO_TENSORS = {
    "Int8Tensor": "int8.int8_tensor", "Float8Tensor": "float8.float8_tensor",
    "IntxUnpackedToInt8Tensor": "intx.intx_unpacked_to_int8_tensor", "Int4Tensor": "int4.int4_tensor",
    "Int4PlainInt32Tensor": "int4.int4_plain_int32_tensor",
    "Int4TilePackedTo4dTensor": "int4.int4_tile_packed_to_4d_tensor",
}
TORCHAO_SUBCLASSES: frozenset[str] = frozenset({
    *(f"torchao.quantization.{name}" for name in _TORCHAO_TENSORS),
    *(f"torchao.quantization.quantize_.workflows.{mod}.{name}" for name, mod in _TORCHAO_TENSORS.items()),
})
# Plain values torchao keeps in a subclass's state (enums, granularities, activation-quantization
# records), also on its safe-globals list: a call of one is described (``Call``), never made.
TORCHAO_VALUES: frozenset[str] = frozenset({
    "torchao.quantization.quant_primitives.MappingType", "torchao.quantization.quant_primitives.ZeroPointDomain",
    *(f"torchao.quantization.granularity.{name}"
      for name in ("PerBlock", "PerRow", "PerTensor", "PerGroup", "PerAxis")),
    "torchao.quantization.quantize_.common.kernel_preference.KernelPreference",
    "torchao.quantization.quantize_.workflows.float8.float8_tensor.QuantizeTensorToFloat8Kwargs",
    "torchao.quantization.quantize_.workflows.int8.int8_tensor.QuantizeTensorToInt8Kwargs",
    "torchao.quantization.quantize_.workflows.float8.float8_packing_format.Float8PackingFormat",
    "torchao.quantization.quantize_.workflows.intx.intx_packing_format.IntxPackingFormat",
})


# The descriptions below stay dataclasses, not records: a record is a tuple, and on this stack a tuple is
# a tuple the pickle built.  _call would take a TensorRef as REDUCE's argument tuple, _elements would iterate
# a Global, torch.Size would turn one into a shape, is_hashable would walk an Unsafe's parts.
@dataclass(frozen=True, slots=True)  # not a tuple: a description on the pickle's stack
class Global:
    module: str
    name: str

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(frozen=True, slots=True)  # not a tuple: a description on the pickle's stack
class Unsafe:
    """A non-allowlisted global, or what a call of it would have produced.

    ``parts`` keeps what the pickle gave the object (call arguments, BUILD state,
    appended items): never used to build it, only walked for the tensors inside, so
    a whole pickled ``nn.Module`` (or a TorchScript ``__torch__`` object) lists its
    parameters.
    """

    origin: str
    parts: list[object] = field(default_factory=list, compare=False, hash=False, repr=False)


@dataclass(frozen=True, slots=True)  # not a tuple: a description on the pickle's stack
class Call:
    """A call to an allowlisted global we need not model (torch.device('cpu'), ...)."""

    func: str


@dataclass(frozen=True, slots=True)  # not a tuple: a description on the pickle's stack
class Subclass:
    """An allowlisted torchao tensor class, named and never imported."""

    dotted: str


@dataclass(frozen=True, slots=True)  # not a tuple: a description on the pickle's stack
class SubclassTensor:
    """A torchao subclass instance: its logical shape and dtype, plain component tensors, plain attributes."""

    cls: str
    shape: tuple[int, ...]
    dtype: str
    components: tuple[tuple[str, TensorRef], ...]
    attributes: tuple[tuple[str, object], ...]


@dataclass(frozen=True, slots=True)  # not a tuple: a description on the pickle's stack
class StorageRef:
    key: str
    dtype: str  # torch dtype name of the storage; "uint8" for untyped storages
    nbytes: int
    view_offset: int = 0  # bytes into the root storage (legacy storage views)


@dataclass(frozen=True, slots=True)  # not a tuple: a description on the pickle's stack
class TensorRef:
    storage: StorageRef | None  # None for meta tensors
    offset: int  # in elements
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str  # torch dtype name


class DictDesc:
    """A dict or OrderedDict: key/value pairs in pickle order (keys need not be hashable)."""

    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: list[tuple[object, object]] = []


class SetDesc:
    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: list[object] = []


class PickleStream(Protocol):
    def read(self, size: int, /) -> bytes: ...
    def readline(self, size: int = -1, /) -> bytes: ...
    def tell(self) -> int: ...


def _bad(message: str) -> MalformedCheckpoint:
    return MalformedCheckpoint(message)


# Opcodes that push their decoded argument: ints, floats, strings, bytes.
_PUSH_ARG = frozenset({
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "STRING", "BINSTRING",
    "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8", "UNICODE",
    "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "FLOAT", "BINFLOAT",
})


# opcode byte -> (name, argument reader), from pickletools' table.
_OPCODES = {
    op.code.encode("latin-1"): (op.name, op.arg.reader if op.arg is not None else None)
    for op in pickletools.opcodes
}


class PickleWalker:
    """Walks one or more pickles; ``unsafe`` collects non-allowlisted globals in order.

    ``torchscript``: the pickle is a TorchScript archive's.  Its ``__torch__.*`` classes
    are compiled from the archive's own ``code/`` by the TorchScript runtime (no Python
    class is imported): they become opaque records, listed in ``opaque``, not ``unsafe``;
    the ``torch.jit._pickle`` helpers that only tag a value's type pass it through.
    """

    def __init__(self, persistent_load: Callable[[object], object], *, torchscript: bool = False) -> None:
        self.persistent_load = persistent_load
        self.torchscript = torchscript
        self.unsafe: dict[str, None] = {}
        self.quantized = 0  # tensors built by _rebuild_qtensor: integer bytes whose scales live in the pickle
        self.opaque: dict[str, None] = {}
        self.opcodes = 0

    def walk(self, stream: PickleStream) -> object:
        """Walk one pickle up to STOP and return the description of its result."""
        stack: list[object] = []
        marks: list[list[object]] = []
        memo: dict[int, object] = {}

        def pop() -> object:
            if not stack:
                raise _bad("pickle stack underflow")
            return stack.pop()

        def pop_mark() -> list[object]:
            nonlocal stack
            if not marks:
                raise _bad("pickle MARK missing")
            items, stack = stack, marks.pop()
            return items

        def top() -> object:
            if not stack:
                raise _bad("pickle stack underflow")
            return stack[-1]

        read, opcodes = stream.read, _OPCODES
        hashed_keys = not self.torchscript  # torch.load's dicts hash their keys (TorchScript's C++ dicts: not modelled)
        while True:
            code = read(1)
            if not code:
                raise _bad("pickle ends before its STOP opcode")
            entry = opcodes.get(code)
            if entry is None:
                raise _bad(f"unknown pickle opcode {code!r} at byte {stream.tell() - 1}")
            self.opcodes += 1
            name, reader = entry
            if name in ("GLOBAL", "INST"):
                arg: Any = (self._line(stream), self._line(stream))  # each opcode's own: its name tells which
            elif reader is None:
                arg = None
            else:
                try:
                    arg = reader(stream)  # type: ignore[arg-type]  # PickleStream has the read/readline the opcode readers use
                except (ValueError, OverflowError) as exc:
                    raise _bad(f"bad {name} argument before byte {stream.tell()}: {exc}") from None
                if name in ("SHORT_BINSTRING", "BINSTRING"):  # a Python 2 str: torch.load decodes it as UTF-8
                    try:
                        arg = arg.encode("latin-1").decode("utf-8")
                    except UnicodeDecodeError:
                        raise _bad(f"Python 2 string before byte {stream.tell()} is not UTF-8") from None
                if name in _PUSH_ARG:
                    if len(stack) >= MAX_STACK:
                        raise _bad("pickle stack exceeds the size limit")
                    stack.append(arg)
                    continue
            if len(stack) >= MAX_STACK or len(memo) >= MAX_MEMO:
                raise _bad("pickle stack or memo exceeds the size limit")

            if name in ("BINPUT", "LONG_BINPUT", "PUT"):
                memo[int(arg)] = top()
            elif name == "MEMOIZE":
                memo[len(memo)] = top()
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                if arg not in memo:
                    raise _bad(f"pickle memo slot {arg} read before it is written")
                stack.append(memo[arg])
            elif name == "MARK":
                if len(marks) >= MAX_MARKS:
                    raise _bad(f"pickle nests more than {MAX_MARKS} MARKs")
                marks.append(stack)
                stack = []
            elif name in ("TUPLE", "LIST", "DICT", "FROZENSET", "POP_MARK"):
                items = pop_mark()
                if name == "TUPLE":
                    stack.append(tuple(items))
                elif name == "LIST":
                    stack.append(items)
                elif name == "DICT":
                    stack.append(_dict_from(items, hashed_keys=hashed_keys))
                elif name == "FROZENSET":
                    frozen = SetDesc()
                    frozen.items.extend(items)
                    stack.append(frozen)
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                if len(stack) < n:
                    raise _bad("pickle stack underflow")
                stack[-n:] = [tuple(stack[-n:])]
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name == "EMPTY_LIST":
                stack.append([])
            elif name == "EMPTY_DICT":
                stack.append(DictDesc())
            elif name == "EMPTY_SET":
                stack.append(SetDesc())
            elif name == "APPEND":
                item = pop()
                _append(top(), [item])
            elif name == "APPENDS":
                items = pop_mark()
                _append(top(), items)
            elif name == "SETITEM":
                value, key = pop(), pop()
                _setitems(top(), [key, value], hashed_keys=hashed_keys)
            elif name == "SETITEMS":
                items = pop_mark()
                _setitems(top(), items, hashed_keys=hashed_keys)
            elif name == "ADDITEMS":
                items = pop_mark()
                target = top()
                if isinstance(target, SetDesc):
                    target.items.extend(items)
                elif not isinstance(target, Unsafe):
                    raise _bad("ADDITEMS on something that is not a set")
            elif name == "POP":
                if stack:
                    stack.pop()
                else:
                    pop_mark()
            elif name == "DUP":
                stack.append(top())
            elif name in ("GLOBAL", "INST"):
                module, attr = arg
                glob = self._global(module, attr)
                if name == "GLOBAL":
                    stack.append(glob)
                else:
                    stack.append(self._call(glob, tuple(pop_mark())))
            elif name == "STACK_GLOBAL":
                attr, module = pop(), pop()
                if not isinstance(module, str) or not isinstance(attr, str):
                    raise _bad("STACK_GLOBAL needs two strings")
                stack.append(self._global(module, attr))
            elif name in ("EXT1", "EXT2", "EXT4"):
                origin = f"copyreg extension code {arg}"
                self.unsafe.setdefault(origin)
                stack.append(Unsafe(origin))
            elif name == "REDUCE":
                args = pop()
                stack.append(self._call(pop(), args))
            elif name == "NEWOBJ":
                args = pop()
                stack.append(self._call(pop(), args))
            elif name == "NEWOBJ_EX":
                pop()  # kwargs: the call is described, never made
                args = pop()
                stack.append(self._call(pop(), args))
            elif name == "OBJ":
                items = pop_mark()
                if not items:
                    raise _bad("OBJ without a class")
                stack.append(self._call(items[0], tuple(items[1:])))
            elif name == "BUILD":
                state = pop()  # set on an object we never build; kept where tensors may hide in it
                self._build(top(), state)
            elif name == "BINPERSID":
                stack.append(self.persistent_load(pop()))
            elif name == "PERSID":
                raise _bad("text persistent ids (PERSID) are not written by torch")
            elif name in ("NEXT_BUFFER", "READONLY_BUFFER"):
                raise _bad("pickle uses out-of-band buffers (protocol 5), which torch never writes")
            elif name == "PROTO":
                if self.torchscript and arg != 2:
                    # torch.jit.load's unpickler (C++) takes protocol 2 alone, what torch.jit.save writes
                    raise _bad(f"TorchScript record declares pickle protocol {arg}; "
                               "torch.jit.load reads protocol 2 only")
            elif name == "FRAME":
                pass
            elif name == "STOP":
                return pop()
            elif name in ("NONE", "NEWTRUE", "NEWFALSE"):
                stack.append({"NONE": None, "NEWTRUE": True, "NEWFALSE": False}[name])
            else:  # pragma: no cover - pickletools knows no opcode this chain misses
                raise _bad(f"unhandled pickle opcode {name}")

    def _build(self, target: object, state: object) -> None:
        """BUILD's state on a description (a walker for another allow-list keeps it on its own records)."""
        if isinstance(target, Unsafe):
            target.parts.append(state)
        elif isinstance(target, TensorRef) and not self.torchscript:
            # torch.load runs ``tensor.set_(*state)`` (pre-0.4 pickles), which fails on almost any
            # state and would rebuild the tensor on the rest; torch.save has not written it since
            raise _bad("pickle BUILDs a state onto a tensor, which torch.save does not write "
                       "(torch.load would reset the tensor with set_)")

    def _line(self, stream: PickleStream) -> str:
        line = stream.readline(MAX_LINE)
        if not line.endswith(b"\n"):
            raise _bad("GLOBAL/INST name is not newline-terminated")
        try:
            text = line[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise _bad("GLOBAL/INST name is not UTF-8") from None
        if self.torchscript and not _SCRIPT_NAME.fullmatch(text):
            # torch.jit.load's unpickler refuses any other byte in a class name ("strings must be
            # qualified Python identifiers"): such a name is a corrupted archive, not another class.
            raise _bad(f"TorchScript class name {text!r} holds characters other than letters, digits, '_' and '.'")
        return text

    def _global(self, module: str, name: str) -> Global | Subclass | Unsafe:
        # pickle maps Python 2 names (``__builtin__.eval``) the same way before importing.
        if (module, name) in NAME_MAPPING:
            module, name = NAME_MAPPING[(module, name)]
        elif module in IMPORT_MAPPING:
            module = IMPORT_MAPPING[module]
        glob = Global(module, name)
        if glob.dotted in ALLOWED_GLOBALS or (self.torchscript and glob.dotted in SCRIPT_PASS_THROUGH):
            return glob
        if not self.torchscript and glob.dotted in TORCHAO_SUBCLASSES:
            return Subclass(glob.dotted)  # stands where a Global is resolved (TORCHAO_SUBCLASSES)
        if not self.torchscript and glob.dotted in TORCHAO_VALUES:
            return glob
        if self.torchscript and (module == "__torch__" or module.startswith("__torch__.")):
            self.opaque.setdefault(glob.dotted)
        else:
            self.unsafe.setdefault(glob.dotted)
        return Unsafe(glob.dotted)

    def _call(self, func: object, args: object) -> object:
        if isinstance(func, Unsafe):
            return Unsafe(func.origin, [args])  # one record per object, to hold its own state
        if isinstance(func, Subclass):  # a torchao class called outside its rebuild: an inert value
            return Call(func.dotted)
        if not isinstance(func, Global):
            raise _bad(f"pickle calls a {type(func).__name__}, not a global")
        if isinstance(args, list):  # REDUCE calls func(*args): a list does as well as a tuple
            args = tuple(args)
        if not isinstance(args, tuple):
            if isinstance(args, Unsafe):
                return args
            elements = None if self.torchscript else _elements(args)  # torch.load: any iterable does
            if elements is None:
                raise _bad(f"arguments to {func.dotted} are not a tuple")
            args = tuple(elements)
        dotted = func.dotted
        if dotted in ("torch._utils._rebuild_tensor", "torch._utils._rebuild_tensor_v2",
                      "torch._utils._rebuild_tensor_v3", "torch._utils._rebuild_qtensor"):
            if func.name == "_rebuild_qtensor":
                self.quantized += 1
            return _rebuild_tensor(func.name, args, torch_load=not self.torchscript)
        if dotted in ("torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state",
                      "torch.nn.parameter.Parameter"):
            if len(args) >= 2 and not self.torchscript:  # Parameter(data, requires_grad): a bool alone
                data = args[0] if isinstance(args[0], TensorRef) else None
                _check_requires_grad(func.name, args[1], data.storage if data else None, data.dtype if data else None)
            return args[0] if args else Call(dotted)
        if dotted == "torch._tensor._rebuild_from_type_v2":
            if len(args) != 4:
                raise _bad("_rebuild_from_type_v2 takes 4 arguments")
            if isinstance(args[1], Subclass):
                return _subclass_tensor(args[1], args[0], args[2], args[3])
            return self._call(args[0], args[2])
        if dotted == "torch._utils._rebuild_meta_tensor_no_storage" and len(args) >= 3:
            dtype = _torch_dtype(args[0])
            shape, stride = _ints(args[1], "size"), _ints(args[2], "stride")
            return TensorRef(None, 0, shape, stride, dtype)
        if dotted in ("collections.OrderedDict", "collections.Counter"):
            # torch.jit.load's unpickler drops an OrderedDict's arguments (backward hooks, never used)
            return DictDesc() if self.torchscript else _mapping_from(func.name, args)
        if dotted == "builtins.set" and args and isinstance(args[0], list):  # protocol 2's sets
            out_set = SetDesc()
            out_set.items.extend(args[0])
            return out_set
        if dotted in SCRIPT_PASS_THROUGH:
            return args[0] if args else Call(dotted)
        if dotted == "torch.Size" and args and isinstance(args[0], (tuple, list)):
            return tuple(args[0])
        if dotted == "_codecs.encode" and len(args) == 2 and isinstance(args[0], str) and isinstance(args[1], str):
            try:
                return args[0].encode(args[1])
            except LookupError:
                raise _bad(f"_codecs.encode with unknown codec {args[1]!r}") from None
        return Call(dotted)


def _mapping_from(kind: str, args: tuple[object, ...]) -> DictDesc | Unsafe:
    """``OrderedDict(arg)`` or ``Counter(arg)``, as the weights-only unpickler calls it: from a
    mapping, its items; OrderedDict from any other iterable, one (key, value) pair per element
    (Python 2 pickled its pairs as lists); Counter from one, each element a key counted once."""
    if len(args) > 1:
        raise _bad(f"{kind} takes at most 1 argument, got {len(args)}")
    out = DictDesc()
    source = args[0] if args else None
    if isinstance(source, Unsafe):
        return source  # already reported as CG003; torch.load refuses the file
    if isinstance(source, DictDesc):
        out.items.extend(source.items)
        return out
    if not args or (source is None and kind == "Counter"):  # Counter(None) is an empty Counter
        return out
    elements = _elements(source)
    if elements is None:
        raise _bad(f"{kind} is built from {kind_of(source)}, which is not iterable")
    for element in elements:
        if kind == "OrderedDict":
            pair = _elements(element)
            if pair is None or len(pair) != 2:  # torch.load: "too many values to unpack (expected 2)"
                raise _bad(f"OrderedDict is built from {kind_of(element)} that is not a (key, value) pair")
            key, value = pair
        else:
            key, value = element, 1
        if not is_hashable(key):
            raise _bad(f"{kind} key is {kind_of(key)}, which is unhashable")
        out.items.append((key, value))
    return out


def _elements(value: object) -> list[object] | None:
    """What iterating ``value`` yields, where Python's iteration of the built object is known; None: not iterable."""
    if isinstance(value, (list, tuple, str, bytes)):
        return list(value)  # bytes: ints, as Python 3 iterates them
    if isinstance(value, DictDesc):
        return [key for key, _ in value.items]
    if isinstance(value, SetDesc):
        return list(value.items)
    return None


def is_hashable(value: object) -> bool:
    """Whether the object a description stands for can be a dict key (lists, dicts, sets cannot)."""
    if isinstance(value, (list, DictDesc, SetDesc)):
        return False
    return all(is_hashable(v) for v in value) if isinstance(value, tuple) else True


def kind_of(value: object) -> str:
    """A description named, with its article, as the type torch.load would have built: "a dict", "an int"."""
    names = {DictDesc: "dict", SetDesc: "set", TensorRef: "tensor", StorageRef: "storage"}
    name = names.get(type(value), type(value).__name__)
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _truthy(value: object) -> bool:
    """``bool()`` of the object a description stands for (an empty container is false)."""
    if isinstance(value, (DictDesc, SetDesc)):
        return bool(value.items)
    if isinstance(value, (Global, Call, TensorRef, StorageRef, Unsafe)):
        return True
    return bool(value)


# the dtypes whose tensors torch.load can rebuild with requires_grad=True (torch 2.13); float8, float4
# and complex32 may require gradients, but torch.load rebuilds them in place after setting the flag ("a leaf
# Variable that requires grad is being used in an in-place operation"), and the rest may not
_GRAD_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16", "complex64", "complex128"})


def _check_requires_grad(kind: str, value: object, storage: StorageRef | None, dtype: str | None) -> None:
    # torch sets ``tensor.requires_grad = value``, which takes a bool alone ("requires_grad must be a bool"),
    # and True only on a floating point or complex tensor ("only Tensors of floating point and complex
    # dtype can require gradients")
    where = f" (storage {storage.key!r})" if storage else ""
    if type(value) is not bool and not isinstance(value, Unsafe):
        raise _bad(f"{kind}: requires_grad is {kind_of(value)}, not a bool{where}")
    if value is True and dtype is not None and dtype not in _GRAD_DTYPES:
        why = ("torch.load rebuilds such a tensor in place after setting the flag, and fails"
               if dtype.startswith(("float", "complex")) else
               "torch lets only floating point and complex tensors require gradients")
        raise _bad(f"{kind}: requires_grad on a tensor of {dtype}{where}: {why}")


def _check_metadata(kind: str, metadata: object, storage: StorageRef) -> None:
    """torch calls ``set_tensor_metadata`` when the argument is true: a dict of str (or bytes)
    keys to flags (None, bool, int or float); anything else fails as torch.load runs it."""
    if not _truthy(metadata):
        return
    if not isinstance(metadata, DictDesc):
        raise _bad(f"{kind}: tensor metadata is {kind_of(metadata)}, not a dict (storage {storage.key!r})")
    for key, value in metadata.items:
        if not isinstance(key, (str, bytes)) or not (value is None or type(value) in (bool, int, float)):
            raise _bad(f"{kind}: tensor metadata is not a dict of names to flags (storage {storage.key!r})")


def _dict_from(items: list[object], *, hashed_keys: bool = False) -> DictDesc:
    out = DictDesc()
    _setitems(out, items, hashed_keys=hashed_keys)
    return out


def _append(target: object, items: list[object]) -> None:
    if isinstance(target, list):
        target.extend(items)
    elif isinstance(target, Unsafe):
        target.parts.append(items)
    elif not isinstance(target, Call):
        raise _bad(f"APPEND on a {type(target).__name__}, not a list")


def _setitems(target: object, items: list[object], *, hashed_keys: bool = False) -> None:
    """``hashed_keys``: refuse a key the built dict could not hold, as torch.load's unpickler does
    ("unhashable type: 'dict'"); a description itself keeps any key."""
    if len(items) % 2:
        raise _bad("SETITEMS with an odd number of items")
    if isinstance(target, DictDesc):
        if hashed_keys:
            for key in items[::2]:
                if type(key) is not str and not is_hashable(key):  # str first: state dict keys
                    raise _bad(f"dict key is {kind_of(key)}, which is unhashable")
        target.items.extend(zip(items[::2], items[1::2]))
    elif isinstance(target, Unsafe):
        target.parts.append(_dict_from(items))
    elif not isinstance(target, Call):
        raise _bad(f"SETITEM on a {type(target).__name__}, not a dict")


def _ints(value: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or len(value) > MAX_DIMS:
        raise _bad(f"tensor {what} is not a tuple of integers")
    if not all(type(v) is int and v >= 0 for v in value):
        raise _bad(f"tensor {what} holds a negative or non-integer value")
    return tuple(value)


def _torch_dtype(value: object) -> str:
    if isinstance(value, Global) and value.module == "torch" and value.name in ITEMSIZES:
        return value.name
    raise _bad("tensor dtype is not a torch dtype")


def _rebuild_tensor(kind: str, args: tuple[object, ...], *, torch_load: bool = True) -> TensorRef | Unsafe:
    """The tensor a rebuild call describes; ``torch_load``: also the arguments torch.load's Python
    rebuild functions refuse as they run (requires_grad, metadata), which a description never uses."""
    need = {"_rebuild_tensor": 4, "_rebuild_tensor_v2": 6, "_rebuild_tensor_v3": 7,
            "_rebuild_qtensor": 7}[kind]
    if len(args) < need:
        raise _bad(f"{kind} takes at least {need} arguments, got {len(args)}")
    for arg in args:
        if isinstance(arg, Unsafe):
            return arg  # already reported as CG003; the tensor is not worth guessing
    storage, offset = args[0], args[1]
    if not isinstance(storage, StorageRef):
        raise _bad(f"{kind}: first argument is a {type(storage).__name__}, not a storage")
    if type(offset) is not int or offset < 0:
        raise _bad(f"{kind}: storage offset is not a non-negative integer")
    shape, stride = _ints(args[2], "size"), _ints(args[3], "stride")
    if len(shape) != len(stride):
        raise _bad(f"{kind}: size has {len(shape)} dims but stride has {len(stride)}")
    dtype = _torch_dtype(args[6]) if kind == "_rebuild_tensor_v3" else storage.dtype
    if torch_load and kind != "_rebuild_tensor":
        _check_requires_grad(kind, args[5 if kind == "_rebuild_qtensor" else 4], storage, dtype)
        metadata_at = {"_rebuild_tensor_v2": 6, "_rebuild_tensor_v3": 7}.get(kind)
        if metadata_at is not None and len(args) > metadata_at:
            _check_metadata(kind, args[metadata_at], storage)
    itemsize = ITEMSIZES[dtype]
    extent = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    if extent and (offset + extent) * itemsize > storage.nbytes:  # empty slices may sit anywhere
        raise _bad(
            f"tensor of size {list(shape)} at offset {offset} runs past its storage "
            f"{storage.key!r} ({storage.nbytes} bytes)"
        )
    return TensorRef(storage, offset, shape, stride, dtype)


def _subclass_tensor(cls: Subclass, func: object, args: object, state: object) -> SubclassTensor:
    """``_rebuild_from_type_v2(_rebuild_wrapper_subclass, cls, (cls, dtype, size, stride, ...), state)``."""
    if not (isinstance(func, Global) and func.dotted == "torch._utils._rebuild_wrapper_subclass"):
        raise _bad(f"{cls.dotted} is rebuilt through something other than _rebuild_wrapper_subclass")
    if not isinstance(args, tuple) or len(args) < 3:
        raise _bad(f"{cls.dotted}: _rebuild_wrapper_subclass takes at least 3 arguments")
    dtype, shape = _torch_dtype(args[1]), _ints(args[2], "size")
    components: list[tuple[str, TensorRef]] = []
    attributes: list[tuple[str, object]] = []
    for key, value in (state.items if isinstance(state, DictDesc) else []):
        if not isinstance(key, str):
            raise _bad(f"{cls.dotted}: state key is a {type(key).__name__}, not a string")
        if isinstance(value, TensorRef):
            components.append((key, value))
        elif value is None or isinstance(value, (bool, int, float, str)) or (
                isinstance(value, (list, tuple)) and all(type(v) is int for v in value)):
            attributes.append((key, list(value) if isinstance(value, tuple) else value))
    return SubclassTensor(cls.dotted, shape, dtype, tuple(components), tuple(attributes))
