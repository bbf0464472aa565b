"""ONNX: the ModelProto walk, its field numbers and its tensors."""
