"""torchao: tensor subclasses stored as their plain component tensors.

Both torchao's safetensors flattening (``torchao.prototype.safetensors``) and this tool's
reading of a pickled subclass (``guard.readers.torch.tensors``) name a subclass weight
``P.weight``'s components ``P._weight_qdata``, ``P._weight_scale`` and ``P._weight_zero_point``.
As torchao's ``dequantize()``:

- ``Int8Tensor`` / ``IntxUnpackedToInt8Tensor`` (``dequantize_affine``): ``(qdata - zero_point) * scale``;
- ``Float8Tensor`` (``_dequantize_affine_float8``): ``float(qdata) * scale``;

the scale broadcast per tensor, row, group or block, read from its shape (torchao's
``block_size`` is the weight's shape divided by the scale's).  Packed int4 layouts
(``Int4Tensor``, tile-packed) depend on a kernel library's private packing and are refused.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from guard.convert.read.dequant import DequantError, Read
from guard.convert.read.dequant.compressed_tensors import affine, optional, stored_names

if TYPE_CHECKING:
    import numpy as np

_COMPONENT = re.compile(r"^(?P<module>.+)\._(?P<attr>[A-Za-z0-9_]+?)_qdata$")


def _names(module: Any) -> tuple[str, str]:
    """(output name, component stem): ``P._weight_qdata`` -> (``P.weight``, ``P._weight_``)."""
    match = _COMPONENT.match(module.payload)
    if match is None:
        raise DequantError("CG110", module.payload, "torchao payload is not named P._ATTR_qdata")
    return f"{match['module']}.{match['attr']}", f"{match['module']}._{match['attr']}_"


def outputs(module: Any, quant: Any, read: Read) -> dict[str, tuple[int, ...]]:
    name, _ = _names(module)
    if module.logical_shape:
        return {name: tuple(module.logical_shape)}
    return {name: tuple(read(module.payload).shape)}


def dequantize(module: Any, quant: Any, read: Read) -> dict[str, np.ndarray]:
    import numpy as np

    name, stem = _names(module)
    names = stored_names(module)
    qdata = read(module.payload)
    # the unpacked layouts hold int8 codes (Int8Tensor, IntxUnpackedToInt8Tensor) or float8 ones (Float8Tensor);
    # uint8 and int32 payloads are int4 packed for a kernel library (Int4Tensor, Int4PlainInt32Tensor, ...)
    if not (qdata.dtype == np.int8 or (qdata.dtype.itemsize == 1 and qdata.dtype.kind == "V")):
        raise DequantError("CG112", module.payload, f"torchao payload of dtype {qdata.dtype} is a packed "
                           "int4 layout this tool does not dequantize")
    if module.logical_shape and tuple(module.logical_shape) != qdata.shape:
        raise DequantError("CG112", module.payload, f"torchao payload {list(qdata.shape)} is packed "
                           f"(logical {list(module.logical_shape)}); packed layouts are not dequantized")
    scale = read(f"{stem}scale").astype(np.float32)
    zero = optional(read, f"{stem}zero_point", names)
    return {name: affine(qdata, scale, None if zero is None else zero.astype(np.float32), name=f"{stem}scale")}
