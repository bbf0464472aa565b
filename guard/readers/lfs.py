"""Git LFS pointer files standing where weights should be (CG002)."""

from __future__ import annotations

import re

from guard.catalogue import make_finding
from guard.sources import ByteSource
from guard.tensors import FileScan

_PREFIX = b"version https://git-lfs.github.com/spec/"
_MAX_POINTER = 1024  # the LFS spec caps pointer files well below this
# patterns, compiled on the first pointer (re caches them): every scan imports this module, few meet one
_OID = rb"^oid sha256:([0-9a-f]{64})$"
_SIZE = rb"^size (\d+)$"


def is_lfs_pointer(head: bytes) -> bool:
    return head.startswith(_PREFIX) or head.startswith(b"version https://hawser.github.com/spec/v1")


def read_lfs_pointer(source: ByteSource) -> FileScan:
    data = source.read_at(0, min(source.size, _MAX_POINTER))
    size = re.search(_SIZE, data, re.M)
    oid = re.search(_OID, data, re.M)
    detail = ""
    if size:
        detail = f" for a {int(size.group(1)):,}-byte object"
    if oid:
        detail += f" (oid sha256:{oid.group(1).decode()[:12]}…)"
    message = (
        f"Git LFS pointer{detail} instead of weights: the checkout did not fetch LFS objects. "
        "Set `lfs: true` on actions/checkout, or run `git lfs pull`."
    )
    return FileScan(
        path=source.name, format="lfs-pointer", size=source.size,
        findings=(make_finding("CG002", source.name, message),),
        bytes_read=len(data),
    )
