"""The parts of ``onnx.proto`` (onnx-ml, IR version 11) a wire-format walk needs, as data.

Every message reachable from ModelProto, each field number with its kind: a message
name, or ``varint`` / ``fixed32`` / ``fixed64`` / ``bytes``; ``*`` marks a repeated
field.  Taken from the field descriptors of the ``onnx`` package (1.2x); a field
this table lacks is an unknown field, which protobuf skips too.  ``DATA_TYPES``
maps ``TensorProto.DataType`` to dtype codes.
"""

from __future__ import annotations

SCHEMA: dict[str, dict[int, str]] = {
    "ModelProto": {1: "varint", 8: "OperatorSetIdProto*", 2: "bytes", 3: "bytes", 4: "bytes", 5: "varint",
                   6: "bytes", 7: "GraphProto", 14: "StringStringEntryProto*", 20: "TrainingInfoProto*",
                   25: "FunctionProto*", 26: "DeviceConfigurationProto*"},
    "DeviceConfigurationProto": {1: "bytes", 2: "varint", 3: "bytes*"},
    "FunctionProto": {1: "bytes", 4: "bytes*", 5: "bytes*", 6: "bytes*", 11: "AttributeProto*",
                      7: "NodeProto*", 8: "bytes", 9: "OperatorSetIdProto*", 10: "bytes", 13: "bytes",
                      12: "ValueInfoProto*", 14: "StringStringEntryProto*"},
    "StringStringEntryProto": {1: "bytes", 2: "bytes"},
    "ValueInfoProto": {1: "bytes", 2: "TypeProto", 3: "bytes", 4: "StringStringEntryProto*"},
    "TypeProto": {1: "TypeProto.Tensor", 4: "TypeProto.Sequence", 5: "TypeProto.Map",
                  9: "TypeProto.Optional", 8: "TypeProto.SparseTensor", 7: "TypeProto.Opaque", 6: "bytes"},
    "TypeProto.Opaque": {1: "bytes", 2: "bytes"},
    "TypeProto.SparseTensor": {1: "varint", 2: "TensorShapeProto"},
    "TensorShapeProto": {1: "TensorShapeProto.Dimension*"},
    "TensorShapeProto.Dimension": {1: "varint", 2: "bytes", 3: "bytes"},
    "TypeProto.Optional": {1: "TypeProto"},
    "TypeProto.Map": {1: "varint", 2: "TypeProto"},
    "TypeProto.Sequence": {1: "TypeProto"},
    "TypeProto.Tensor": {1: "varint", 2: "TensorShapeProto"},
    "OperatorSetIdProto": {1: "bytes", 2: "varint"},
    "NodeProto": {1: "bytes*", 2: "bytes*", 3: "bytes", 4: "bytes", 7: "bytes", 8: "bytes",
                  5: "AttributeProto*", 6: "bytes", 9: "StringStringEntryProto*",
                  10: "NodeDeviceConfigurationProto*"},
    "NodeDeviceConfigurationProto": {1: "bytes", 2: "ShardingSpecProto*", 3: "varint"},
    "ShardingSpecProto": {1: "bytes", 2: "varint*", 3: "IntIntListEntryProto*", 4: "ShardedDimProto*"},
    "ShardedDimProto": {1: "varint", 2: "SimpleShardedDimProto*"},
    "SimpleShardedDimProto": {1: "varint", 2: "bytes", 3: "varint"},
    "IntIntListEntryProto": {1: "varint", 2: "varint*"},
    "AttributeProto": {1: "bytes", 21: "bytes", 13: "bytes", 20: "varint", 2: "fixed32", 3: "varint",
                       4: "bytes", 5: "TensorProto", 6: "GraphProto", 22: "SparseTensorProto",
                       14: "TypeProto", 7: "fixed32*", 8: "varint*", 9: "bytes*", 10: "TensorProto*",
                       11: "GraphProto*", 23: "SparseTensorProto*", 15: "TypeProto*"},
    "SparseTensorProto": {1: "TensorProto", 2: "TensorProto", 3: "varint*"},
    "TensorProto": {1: "varint*", 2: "varint", 3: "TensorProto.Segment", 4: "fixed32*", 5: "varint*",
                    6: "bytes*", 7: "varint*", 8: "bytes", 12: "bytes", 9: "bytes",
                    13: "StringStringEntryProto*", 14: "varint", 10: "fixed64*", 11: "varint*",
                    16: "StringStringEntryProto*"},
    "TensorProto.Segment": {1: "varint", 2: "varint"},
    "GraphProto": {1: "NodeProto*", 2: "bytes", 5: "TensorProto*", 15: "SparseTensorProto*", 10: "bytes",
                   11: "ValueInfoProto*", 12: "ValueInfoProto*", 13: "ValueInfoProto*",
                   14: "TensorAnnotation*", 16: "StringStringEntryProto*"},
    "TensorAnnotation": {1: "bytes", 2: "StringStringEntryProto*"},
    "TrainingInfoProto": {1: "GraphProto", 2: "GraphProto", 3: "StringStringEntryProto*",
                          4: "StringStringEntryProto*"},
}

# TensorProto.DataType -> dtype code (0 UNDEFINED is a broken tensor, not a dtype)
DATA_TYPES: dict[int, str] = {
    1: "F32", 2: "U8", 3: "I8", 4: "U16", 5: "I16", 6: "I32", 7: "I64", 8: "STRING", 9: "BOOL",
    10: "F16", 11: "F64", 12: "U32", 13: "U64", 14: "C64", 15: "C128", 16: "BF16",
    17: "F8_E4M3", 18: "F8_E4M3FNUZ", 19: "F8_E5M2", 20: "F8_E5M2FNUZ", 21: "U4", 22: "I4", 23: "F4",
    24: "F8_E8M0", 25: "U2", 26: "I2", 27: "F6_E2M3", 28: "F6_E3M2",
}

# dtype code -> (typed field holding inline values, values per element) when raw_data is absent;
# numpy_helper.to_array's storage rules: 16-bit and 8-bit types sit one per int32_data entry,
# 4-bit types two per entry, 2-bit four, complex numbers as two floats.
# (field number, values, per elements): ceil(numel * values / per) entries are expected.
TYPED_FIELDS: dict[str, tuple[int, int, int]] = {
    "F32": (4, 1, 1), "C64": (4, 2, 1), "F64": (10, 1, 1), "C128": (10, 2, 1), "I64": (7, 1, 1),
    "U32": (11, 1, 1), "U64": (11, 1, 1), "STRING": (6, 1, 1),
    **{code: (5, 1, 1) for code in ("U8", "I8", "U16", "I16", "I32", "BOOL", "F16", "BF16", "F8_E4M3",
                                    "F8_E4M3FNUZ", "F8_E5M2", "F8_E5M2FNUZ", "F8_E8M0", "F6_E2M3",
                                    "F6_E3M2")},
    "U4": (5, 1, 2), "I4": (5, 1, 2), "F4": (5, 1, 2), "U2": (5, 1, 4), "I2": (5, 1, 4),
}
