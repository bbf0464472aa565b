"""Mutants the torch 0.4-era agreement run (``fuzz/agreement_torchscript.py --count 2000``,
seeds 0-34) and ``fuzz/agreement.py torch-legacy`` (seeds 0 and 4) left unexplained, each
pinned on a real sample with the one change planted by hand.

The legacy files are the ones tests/torch04.py writes as torch 0.4 did; the zip cases are
torch.save archives whose data.pkl carries the same change (the pickle walk is shared).  Each
test asserts our verdict, torch.load's, and the category the differential harness gives the
pair (``explain``: "agree" or a documented one).
"""

from __future__ import annotations

import io
import zipfile
from collections import OrderedDict

import pytest
from fuzz_inputs import FILE_NAMES, REFERENCES, bounded_scan, explain
from torch04 import legacy_samples

torch = pytest.importorskip("torch")

PY2_CUDA, PY3_WINDOWS = legacy_samples()
# what torch.load returns for each sample (the Windows one has no "half")
LEGACY_INVENTORY = {"fc.weight": ("F32", (3, 4)), "fc.bias": ("F32", (3,)), "emb.weight": ("F32", (2, 2)),
                    "emb.scale": ("F32", (2,)), "half": ("F16", (2, 2)), "bn.num_batches_tracked": ("I64", ()),
                    "head.weight": ("F32", (3, 4))}


def _verdicts(fmt: str, data: bytes) -> tuple[str | None, object, object]:
    ours = bounded_scan(data, FILE_NAMES[fmt])
    theirs = REFERENCES[fmt](data)
    return explain(fmt, ours, theirs), ours, theirs


def _planted(data: bytes, old: bytes, new: bytes) -> bytes:
    """``data`` with the one occurrence of ``old`` (the sample's bytes) replaced by ``new``."""
    assert data.count(old) == 1, f"{old!r} occurs {data.count(old)} times in the sample"
    return data.replace(old, new)


def _windows_inventory() -> dict[str, tuple[str, tuple[int, ...]]]:
    return {name: entry for name, entry in LEGACY_INVENTORY.items() if name != "half"}


@pytest.mark.parametrize("data", [PY2_CUDA, PY3_WINDOWS], ids=["python2-cuda", "python3-windows"])
def test_the_samples_themselves_read_as_torch_loads_them(data: bytes) -> None:
    """The boundary: every change below leaves torch 0.4's own files reading as they did."""
    category, ours, theirs = _verdicts("torch-legacy", data)
    assert ours.valid, ours.reason
    assert ours.inventory == theirs
    assert category == "agree"


# ------------------------------------------------------------------ torch.load refuses: so do we

def test_requires_grad_that_is_not_a_bool_is_refused() -> None:
    """Seed 3: an EMPTY_DICT before fc.weight's ``False`` gives ``_rebuild_tensor_v2`` seven
    arguments, ``requires_grad={}``.  torch.load: "requires_grad must be a bool"; the scan
    listed the tensor (a description never sets the flag)."""
    data = _planted(PY3_WINDOWS, b"\x89Ntq\x0bR", b"}\x89Ntq\x0bR")
    category, ours, theirs = _verdicts("torch-legacy", data)
    assert "requires_grad must be a bool" in str(theirs)
    assert not ours.valid
    assert "_rebuild_tensor_v2: requires_grad is a dict, not a bool (storage '94010000000016')" in ours.reason
    assert category == "agree"


def test_ordered_dict_pair_of_three_is_refused() -> None:
    """Seeds 1 and 3: Python 2 pickled an OrderedDict as ``OrderedDict([[key, value], ...])``; an
    EMPTY_DICT after the key ``fc.bias`` makes that pair ``[key, {}, value]``.  torch.load:
    "too many values to unpack (expected 2)"; the scan dropped the pair and fc.bias with it."""
    data = _planted(PY2_CUDA, b"U\x07fc.biasq\x0f", b"U\x07fc.biasq\x0f}")
    category, ours, theirs = _verdicts("torch-legacy", data)
    assert "too many values to unpack" in str(theirs)
    assert not ours.valid
    assert "OrderedDict is built from a list that is not a (key, value) pair" in ours.reason
    assert category == "agree"


def test_storage_id_of_five_items_is_refused() -> None:
    """Seeds 11 and 18: fc.weight's persistent id lost its view (None), leaving the zip form's
    five items.  torch.load's legacy loader: "not enough values to unpack (expected 5, got 4)";
    the scan read it as the zip reader would.  (The walk still goes on past it, so a global
    after it is named: tests/test_hostile_pickles.py.)"""
    data = _planted(PY3_WINDOWS, b"K\x0cNtq\x08Q", b"K\x0ctq\x08Q")
    category, ours, theirs = _verdicts("torch-legacy", data)
    assert "not enough values to unpack" in str(theirs)
    assert not ours.valid
    assert "1 persistent id(s) of 5 items, the zip form" in ours.reason
    assert category == "agree"


def test_dict_key_that_is_a_dict_is_refused() -> None:
    """Seed 24: in the state dict's ``_metadata``, the key ``"version"`` became the memo slot of
    the dict being filled.  torch.load: "unhashable type: 'dict'"; a description keeps any key."""
    data = _planted(PY3_WINDOWS, b"}q:h8K\x01s", b"}q:h:K\x01s")
    category, ours, theirs = _verdicts("torch-legacy", data)
    assert "unhashable type: 'dict'" in str(theirs)
    assert not ours.valid
    assert "dict key is a dict, which is unhashable" in ours.reason
    assert category == "agree"


def test_state_built_onto_a_tensor_is_refused() -> None:
    """Seed 13: a BUILD lands on fc.weight's tensor.  torch.load runs ``tensor.set_(*state)``
    and fails on a string; the scan ignored the state."""
    data = _planted(PY3_WINDOWS, b"\x89Ntq\x0bRq\x0c", b"\x89Ntq\x0bRq\x0cX\x01\x00\x00\x00xb")
    category, ours, theirs = _verdicts("torch-legacy", data)
    assert "set_()" in str(theirs)
    assert not ours.valid
    assert "BUILDs a state onto a tensor" in ours.reason
    assert category == "agree"


# ------------------------------------------------------------------ torch.load accepts: so do we

def test_a_later_id_of_a_root_storage_may_state_any_count() -> None:
    """Seed 1: emb.scale's persistent id names the root storage emb.weight's id made first, with
    an element count of -1.  torch.load makes a root storage once, from its first id, and never
    reads the count again; the scan refused "a bad storage key or element count"."""
    data = _planted(PY2_CUDA, b"\x8a\x01\nU\x0e94010000000080", b"\x8a\x01\xffU\x0e94010000000080")
    category, ours, theirs = _verdicts("torch-legacy", data)
    assert ours.valid, ours.reason
    assert ours.inventory == theirs == LEGACY_INVENTORY
    assert category == "agree"


def test_a_view_past_the_end_of_its_root_is_cut_as_torch_cuts_it() -> None:
    """Seed 1 (then ``stricter-storage``): emb.scale's view of the 10-element root asks for 4
    elements at 8.  torch.load slices the root's bytes as Python slices, so the view holds the 2
    that are there, enough for emb.scale; the scan refused "storage view runs past its root"."""
    data = _planted(PY2_CUDA, b"U\x0e94010000000080q/\x8a\x01\x08\x8a\x01\x02",
                    b"U\x0e94010000000080q/\x8a\x01\x08\x8a\x01\x04")
    category, ours, theirs = _verdicts("torch-legacy", data)
    assert ours.valid, ours.reason
    assert ours.inventory == theirs == LEGACY_INVENTORY
    assert category == "agree"


def test_sys_info_that_is_not_a_dict_is_read() -> None:
    """Seed 2: the last SETITEMS of sys_info became TUPLE, so sys_info is a tuple.  torch.load reads
    sys_info and looks at nothing in it; the scan refused "sys_info is not a dict".  (It is still
    walked: a global hidden in it is CG003, tests/test_hostile_pickles.py.)"""
    data = _planted(PY2_CUDA, b"K\x08uu.", b"K\x08ut.")
    category, ours, theirs = _verdicts("torch-legacy", data)
    assert ours.valid, ours.reason
    assert ours.inventory == theirs == LEGACY_INVENTORY
    assert category == "agree"


def test_root_key_that_is_not_a_string_is_a_storage_outside_the_key_list() -> None:
    """Seed 1: emb.scale's id names its root by the memo slot of fc.weight's size, the tuple
    ``(3, 4)``.  torch.load makes a new storage under that key, which the storage list (strings)
    never fills: emb.scale is uninitialised memory.  Refused, as a storage missing from the list
    is (``stricter-storage``); before, for "a bad storage key", which no category named."""
    data = _planted(PY3_WINDOWS, b"FloatStorage\nq#h\x19", b"FloatStorage\nq#h\x09")
    category, ours, theirs = _verdicts("torch-legacy", data)
    assert theirs == _windows_inventory()
    assert not ours.valid
    assert "storage keyed by a tuple, not a string, is missing from the storage list" in ours.reason
    assert category == "stricter-storage"


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_magic_pickled_at_another_protocol_is_not_a_weight_file_to_us() -> None:
    """Seeds 8, 13, 19, 23, 28, 33: the PROTO byte of the magic number's pickle became 0 or 6.
    torch's unpickler takes any PROTO; the sniffer matches the magic pickled at protocol 2-5,
    and says the file is no weight file it reads (``stricter-magic``, whose pattern had gone
    stale when the sniffer's message changed)."""
    data = _planted(PY2_CUDA, b"\x80\x02\x8a\n", b"\x80\x06\x8a\n")
    category, ours, theirs = _verdicts("torch-legacy", data)
    assert theirs == LEGACY_INVENTORY
    assert not ours.valid
    assert "not a weight file of a format read here" in ours.reason
    assert category == "stricter-magic"


# ------------------------------------------------------------------ the zip reader walks the same way

def _torch_zip(edit: tuple[bytes, bytes], tensor: object = None) -> bytes:
    """torch.save of a state dict, its data.pkl changed and the archive rewritten (CRCs valid)."""
    saved = io.BytesIO()
    torch.save(OrderedDict(w=torch.ones(2, 2) if tensor is None else tensor), saved)
    out = io.BytesIO()
    with zipfile.ZipFile(saved) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            member = source.read(info)
            if info.filename.endswith("/data.pkl"):
                member = _planted(member, *edit)
            target.writestr(info.filename, member)
    return out.getvalue()


ZIP_CASES = {
    "unchanged": ((b")Rq\x01", b")Rq\x01"), None, None),
    "requires-grad-a-dict": ((b"\x89h\x00)R", b"}\x89h\x00)R"), "requires_grad must be a bool",
                             "requires_grad is a dict, not a bool (storage '0')"),
    "ordered-dict-pair-of-three": ((b"q\x00)Rq\x01", b"q\x00]](K\x01K\x02K\x03ea\x85Rq\x01"),
                                   "too many values to unpack", "not a (key, value) pair"),
    "ordered-dict-from-a-number": ((b"q\x00)Rq\x01", b"q\x00K\x01\x85Rq\x01"), "not iterable",
                                   "OrderedDict is built from an int, which is not iterable"),
    # fuzz/agreement.py torch-legacy --seed 4: the call's arguments grew to six
    "ordered-dict-two-arguments": ((b"q\x00)Rq\x01", b"q\x00K\x01K\x02\x86Rq\x01"),
                                   "expected at most 1 arguments, got 2",
                                   "OrderedDict takes at most 1 argument, got 2"),
    # fuzz/agreement.py torch-legacy --seed 0: REDUCE calls func(*args), and a dict's keys are arguments too
    "ordered-dict-arguments-an-empty-dict": ((b"q\x00)Rq\x01", b"q\x00}Rq\x01"), None, None),
}


@pytest.mark.parametrize("case", ZIP_CASES)
def test_zip_reader_takes_the_same_calls_as_torch_load(case: str) -> None:
    edit, theirs_says, ours_says = ZIP_CASES[case]
    category, ours, theirs = _verdicts("torch-zip", _torch_zip(edit))
    if theirs_says is None:
        assert ours.valid, ours.reason
        assert ours.inventory == theirs == {"w": ("F32", (2, 2))}
    else:
        assert theirs_says in str(theirs)
        assert not ours.valid
        assert ours_says in ours.reason
    assert category == "agree"


@pytest.mark.parametrize("dtype", ["int64", "bool", "uint8", "float8_e4m3fn", "complex32", "bfloat16", "float32"])
def test_requires_grad_where_torch_load_cannot_set_it_is_refused_as_torch_load_refuses(dtype: str) -> None:
    """``requires_grad=True`` (NEWTRUE for NEWFALSE): torch.load sets the flag, and fails on an integer or bool
    tensor ("only Tensors of floating point and complex dtype can require gradients") and on a float8 or
    complex32 one (rebuilt in place after the flag is set); bf16 and fp32 load. Our verdict follows (the
    first was the documented ``call-semantics`` disagreement)."""
    tensor = torch.zeros(3, dtype=getattr(torch, dtype))
    category, ours, theirs = _verdicts("torch-zip", _torch_zip((b"\x89h\x00)R", b"\x88h\x00)R"), tensor))
    if dtype in ("bfloat16", "float32"):
        assert ours.valid, ours.reason
        assert ours.inventory == theirs
    else:
        assert "require" in str(theirs)
        assert not ours.valid and f"requires_grad on a tensor of {dtype}" in ours.reason
    assert category == "agree"
