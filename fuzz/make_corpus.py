"""Write the seed corpus, fuzz/corpus/<target>/, with the real libraries (run once, commit).

    .venv/bin/python fuzz/make_corpus.py

Seeds are small, varied files: the mutation bases of tests/fuzz_inputs.py, plus the
data.pkl of each torch zip and each legacy file's pickles for the walker target.
"""

from __future__ import annotations

import io
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from fuzz_inputs import sample_checkpoints  # noqa: E402

TARGETS = {"safetensors": "safetensors", "torch_zip": "torch-zip", "torch_legacy": "torch-legacy",
           "torch_export": "torch-export", "executorch": "executorch",
           "flax_msgpack": "flax-msgpack", "gguf": "gguf", "onnx": "onnx", "npy": "npy", "npz": "npz",
           "hdf5": "hdf5", "keras": "keras"}
SUFFIX = {"safetensors": ".safetensors", "torch_zip": ".bin", "torch_legacy": ".bin", "torch_export": ".pt2",
          "executorch": ".pte", "flax_msgpack": ".msgpack", "torch_pickle": ".pkl", "gguf": ".gguf", "onnx": ".onnx",
          "npy": ".npy", "npz": ".npz", "hdf5": ".h5", "keras": ".keras", "orbax_metadata": ".bin",
          "tf_bundle": ".index", "tflite": ".tflite", "openvino": ".xml",
          "coreml": ".bin", "coreml_spec": ".mlmodel", "torchscript": ".pt"}


def main() -> int:
    written = 0
    pickles: list[bytes] = []
    only = set(sys.argv[1:])  # e.g. `make_corpus.py gguf onnx`: leave the other seeds as committed
    for target, reader in TARGETS.items():
        if only and target not in only:
            continue
        samples = sample_checkpoints(reader)
        folder = HERE / "corpus" / target
        folder.mkdir(parents=True, exist_ok=True)
        for i, data in enumerate(samples):
            (folder / f"seed-{i}{SUFFIX[target]}").write_bytes(data)
            written += 1
        if reader == "torch-zip":
            for data in samples:
                with zipfile.ZipFile(io.BytesIO(data)) as archive:
                    pickles.append(archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl"))))
        if reader == "torch-legacy":
            pickles.extend(data[:data.index(b".", 1) + 1] for data in samples[:1])  # the magic pickle
    if not only or "torchscript" in only:
        written += torch_published_seeds(HERE / "corpus")
    if not only or {"dcp_metadata", "zero_states"} & only:
        written += training_seeds(HERE / "corpus")
    if only and "torch_pickle" not in only:
        print(f"wrote {written} seed files under {HERE / 'corpus'}")
        return 0
    folder = HERE / "corpus" / "torch_pickle"
    folder.mkdir(parents=True, exist_ok=True)
    for i, data in enumerate(pickles):
        (folder / f"seed-{i}.pkl").write_bytes(data)
        written += 1
    written += orbax_metadata_seeds(HERE / "corpus" / "orbax_metadata")
    written += tensorflow_seeds(HERE / "corpus")
    written += ir_package_seeds(HERE / "corpus")
    print(f"wrote {written} seed files under {HERE / 'corpus'}")
    return 0


def training_seeds(corpus: Path) -> int:
    """DCP ``.metadata`` files torch writes (tests/fuzz_formats_training.py) and, where DeepSpeed is installed,
    the rank files of a ZeRO-2 and a ZeRO-3 save of the tiny Llama (tests/deepspeed_writers.py).  (The
    committed seeds also hold Accelerate's FSDP2 ``.metadata`` pair, from tests/accelerate_writers.py.)"""
    import tempfile

    import deepspeed_writers
    from fuzz_formats_training import dcp_metadata_samples

    (corpus / "dcp_metadata").mkdir(parents=True, exist_ok=True)
    samples = dcp_metadata_samples()
    for i, data in enumerate(samples):
        (corpus / "dcp_metadata" / f"seed-{i}.bin").write_bytes(data)
    written = len(samples)
    if not deepspeed_writers.deepspeed_available():
        return written
    (corpus / "zero_states").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        for stage, world in ((2, 1), (3, 2)):
            root = Path(scratch) / f"z{stage}"
            deepspeed_writers.write_zero(root, stage=stage, world_size=world, reference=False)
            for rank_file in sorted((root / "global_step1").glob("*.pt")):
                if "pp_rank_1_" in rank_file.name:
                    continue  # rank 0's files are seeds enough
                kind = "model_states" if rank_file.name.endswith("_model_states.pt") else "optim_states"
                (corpus / "zero_states" / f"seed-z{stage}-{kind}.pt").write_bytes(rank_file.read_bytes())
                written += 1
        written += universal_seeds(corpus, Path(scratch) / "z2" / "global_step1")
    return written


# ds_to_universal's files that are seeds: one parameter's master and moment, the step, the optimizer's state
UNIVERSAL_SEEDS = {"model.norm.weight/fp32.pt": "fp32", "model.norm.weight/exp_avg.pt": "exp_avg",
                   "model.norm.weight/step.pt": "step", "optimizer_state.pt": "optimizer_state"}


def universal_seeds(corpus: Path, tag: Path) -> int:
    """``ds_to_universal`` run on a ZeRO-2 tag folder (DeepSpeed's own script, as tests/test_training_zero.py
    runs it): files of its ``zero/`` folder join the ``zero_states`` target (read_zero_input reads them too)."""
    import os
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(tag),
                        "--output_folder", out, "--num_extract_workers", "1", "--num_merge_workers", "1",
                        "--inject_missing_state"], env={**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"},
                       check=True, capture_output=True, timeout=600)
        for relative, seed in UNIVERSAL_SEEDS.items():
            data = (Path(out) / "zero" / relative).read_bytes()
            (corpus / "zero_states" / f"seed-universal-{seed}.pt").write_bytes(data)
    return len(UNIVERSAL_SEEDS)


def torch_published_seeds(corpus: Path) -> int:
    """TorchScript archives torch.jit writes (script, trace, frozen, bf16, lite), and torch 0.4-era
    legacy files (tests/torch04.py: Python 2 pickles, storage views, cuda:0, Windows type_sizes)."""
    from torch04 import legacy_samples
    from torchscript_samples import sample_torchscripts

    (corpus / "torchscript").mkdir(parents=True, exist_ok=True)
    scripts = sample_torchscripts()
    for i, data in enumerate(scripts):
        (corpus / "torchscript" / f"seed-{i}.pt").write_bytes(data)
    legacy = legacy_samples()
    for i, data in enumerate(legacy):
        (corpus / "torch_legacy" / f"seed-torch04-{i}.bin").write_bytes(data)
    return len(scripts) + len(legacy)


def orbax_metadata_seeds(folder: Path) -> int:
    """``_METADATA`` + NUL + one array's zarr metadata, from checkpoints orbax writes."""
    import tempfile

    import numpy as np
    import orbax.checkpoint as ocp

    folder.mkdir(parents=True, exist_ok=True)
    tree = {"params": {"w": np.ones((3, 4), np.float32), "b": np.zeros((4,), np.float16)},
            "step": 3, "ids": np.arange(5, dtype=np.int64)}
    written = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, zarr3 in enumerate((False, True)):
            path = Path(tmp, f"ck{i}").absolute()
            ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False, use_zarr3=zarr3)).save(
                path, args=ocp.args.PyTreeSave(tree))
            array = (path / "params.w" / ("zarr.json" if zarr3 else ".zarray")).read_bytes()
            (folder / f"seed-{i}.bin").write_bytes((path / "_METADATA").read_bytes() + b"\0" + array)
            written += 1
    return written


def write_seeds(corpus: Path, seeds: dict[str, list[Path]]) -> int:
    """Copy each target's files to corpus/<target>/seed-N<suffix>; the number written."""
    written = 0
    for target, paths in seeds.items():
        (corpus / target).mkdir(parents=True, exist_ok=True)
        for i, path in enumerate(paths):
            (corpus / target / f"seed-{i}{SUFFIX[target]}").write_bytes(path.read_bytes())
            written += 1
    return written


def ir_package_seeds(corpus: Path) -> int:
    """OpenVINO .xml files and Core ML weight.bin files, as the real tools write them (tests/ir_package_writers)."""
    import tempfile

    from ir_package_writers import build_coreml, build_openvino

    with tempfile.TemporaryDirectory() as tmp:
        build_openvino(Path(tmp))
        build_coreml(Path(tmp))
        seeds = {"openvino": sorted(Path(tmp).glob("*.xml")), "coreml": sorted(Path(tmp).glob("*.mlpackage/**/*.bin")),
                 "coreml_spec": sorted(Path(tmp).glob("*.mlmodel"))}
        return write_seeds(corpus, seeds)


def tensorflow_seeds(corpus: Path) -> int:
    """Bundle indexes (SavedModel, checkpoints, Keras training state) and TFLite files TensorFlow writes."""
    import tempfile

    from tf_writers import write_all

    with tempfile.TemporaryDirectory() as tmp:
        files = write_all(Path(tmp))["tflite"]
        seeds = {"tf_bundle": sorted(Path(tmp).glob("**/*.index")), "tflite": [Path(files[k]) for k in sorted(files)]}
        return write_seeds(corpus, seeds)


if __name__ == "__main__":
    raise SystemExit(main())

