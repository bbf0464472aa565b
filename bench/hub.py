"""Benchmark: `ckpt-guard hub scan` vs downloading, and an organisation audit.

Against the loopback stand-in Hub (tests/hub_standin.py) with an added latency
per request (default 50 ms, a typical round trip to the Hub):

1. per weight file, the requests and bytes that `hub scan` spends (counted by the
   stand-in) against `hf_hub_download` of the same file;
2. `hub scan --author ORG` over N small repositories with 1 and with several
   workers: repositories per second, next to the latency-bound floor.

Targets: at most 2 requests and under 1 % of the bytes per weight file; an
audit bounded by latency (time ~ N / jobs x round trips), not by N.

    python bench/hub.py [--latency 0.05] [--repos 50] [--jobs 16] [--write-docs]
    python bench/hub.py --only exported    # one group of writers: training, hdf5, headers, exported
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hub_standin import StandinHub  # noqa: E402

MB = 1024 * 1024


def training_files() -> dict[str, bytes]:
    """safetensors (one file, two shards), torch (zip, legacy, TorchScript, .pt2, .pte) and Flax msgpack."""
    import io

    import numpy as np
    from safetensors.numpy import save

    files: dict[str, bytes] = {}
    layers = {f"model.layers.{i}.weight": np.ones((1024, 1024), np.float32) for i in range(8)}
    files["safetensors/model.safetensors"] = save(layers)  # 32 MB, 8 tensors
    index = {}
    for k in (1, 2):
        name = f"model-0000{k}-of-00002.safetensors"
        part = {f"part{k}.layers.{i}.weight": np.ones((1024, 1024), np.float32) for i in range(4)}
        files[f"sharded/{name}"] = save(part)
        index.update(dict.fromkeys(part, name))
    files["sharded/model.safetensors.index.json"] = json.dumps({"weight_map": index}).encode()
    try:
        import torch

        state = {f"layers.{i}.weight": torch.ones(1024, 1024) for i in range(4)}
        for name, zipped in (("torch-zip/pytorch_model.bin", True), ("torch-legacy/pytorch_model.bin", False)):
            buffer = io.BytesIO()
            torch.save(state, buffer, _use_new_zipfile_serialization=zipped)
            files[name] = buffer.getvalue()
        buffer = io.BytesIO()  # TorchScript: data.pkl and constants.pkl beside the storages
        torch.jit.save(torch.jit.script(torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)])),
                       buffer)
        files["torchscript/model.pt"] = buffer.getvalue()
        mlp = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)])
        program = torch.export.export(mlp, (torch.ones(1, 1024),))
        buffer = io.BytesIO()  # torch.export: the configs sit after the weights, next to the directory
        torch.export.save(program, buffer)
        files["torch-export/model.pt2"] = buffer.getvalue()
        try:
            from executorch.exir import to_edge

            files["executorch/model.pte"] = to_edge(program).to_executorch().buffer  # constants in a segment
        except ImportError:
            print("executorch not installed: .pte skipped", file=sys.stderr)
    except ImportError:
        print("torch not installed: torch formats skipped", file=sys.stderr)
    try:
        from flax import serialization

        params = {"params": {f"layer{i}": {"kernel": np.ones((1024, 1024), np.float32)} for i in range(4)}}
        files["flax/flax_model.msgpack"] = serialization.to_bytes(params)
    except ImportError:
        print("flax not installed: msgpack skipped", file=sys.stderr)
    return files


# Written in a child process: TensorFlow, OpenVINO and coremltools each take seconds to import, and
# TensorFlow and torch do not share a process well.  Each writer is skipped where its tool is absent.
_EXPORT_SCRIPT = r"""
import os, sys, numpy as np
out = sys.argv[1]
def mlp(width, depth):
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)]).eval()
try:  # optimum-intel's file name; save_model's default stores f16 (compress_to_fp16=True)
    import openvino as ov, torch
    model = ov.convert_model(mlp(1024, 4), example_input=torch.zeros(1, 1024))
    os.makedirs(os.path.join(out, "openvino"))
    ov.save_model(model, os.path.join(out, "openvino", "openvino_model.xml"), compress_to_fp16=False)
    os.makedirs(os.path.join(out, "openvino-big"))  # 144 MiB of weights: the 1 % target
    ov.save_model(ov.convert_model(mlp(2048, 9), example_input=torch.zeros(1, 2048)),
                  os.path.join(out, "openvino-big", "openvino_model.xml"), compress_to_fp16=False)
except ImportError: pass
try:
    import coremltools as ct, torch
    for name, width, depth in (("coreml", 1024, 4), ("coreml-big", 2048, 10)):  # -big: 160 MiB, 20 blobs
        traced = torch.jit.trace(mlp(width, depth), torch.zeros(1, width))
        os.makedirs(os.path.join(out, name))
        ct.convert(traced, inputs=[ct.TensorType(shape=(1, width))], convert_to="mlprogram",
                   compute_precision=ct.precision.FLOAT32).save(os.path.join(out, name, "model.mlpackage"))
except ImportError: pass
try:
    import tensorflow as tf
    class Dense(tf.Module):
        def __init__(self, width, depth):
            rng = np.random.default_rng(0)  # distinct values: TFLite keeps one buffer per distinct constant
            self.kernels = [tf.Variable(rng.standard_normal((width, width)).astype(np.float32)) for _ in range(depth)]
        @tf.function(input_signature=[tf.TensorSpec([1, None])], autograph=False)
        def __call__(self, x):
            for k in self.kernels:
                x = tf.matmul(x, k)
            return x
    tf.saved_model.save(Dense(1024, 4), os.path.join(out, "tf-savedmodel"))
    tf.train.Checkpoint(model=Dense(1024, 4)).write(os.path.join(out, "tf-checkpoint", "ckpt-1"))
    for name, width, depth in (("tflite/model.tflite", 1024, 4), ("tflite-big/model.tflite", 2048, 9)):
        module = Dense(width, depth)
        fn = module.__call__.get_concrete_function(tf.TensorSpec([1, width]))
        data = tf.lite.TFLiteConverter.from_concrete_functions([fn], module).convert()
        os.makedirs(os.path.dirname(os.path.join(out, name)), exist_ok=True)
        open(os.path.join(out, name), "wb").write(data)
except ImportError: pass
"""


def exported_files() -> dict[str, bytes]:
    """OpenVINO IR, Core ML, TensorFlow bundles and TFLite as their tools write them, and ONNX Constant nodes."""
    import subprocess

    files: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
        proc = subprocess.run([sys.executable, "-c", _EXPORT_SCRIPT, tmp], env=env, capture_output=True, text=True)
        if proc.returncode:
            print(f"exported formats skipped: {proc.stderr[-500:]}", file=sys.stderr)
        root = Path(tmp)
        for path in sorted(root.rglob("*")):
            if path.is_file():
                files[path.relative_to(root).as_posix()] = path.read_bytes()
    try:  # paddle2onnx's layout: every weight a Constant node's value, none an initializer
        import numpy as np
        from onnx import TensorProto, helper, numpy_helper

        for name, width, depth in (("onnx-constant/model.onnx", 1024, 8), ("onnx-constant-big/model.onnx", 2048, 9)):
            nodes = [helper.make_node("Constant", [], [f"w{i}"],
                                      value=numpy_helper.from_array(np.ones((width, width), np.float32), f"w{i}"))
                     for i in range(depth)]
            nodes += [helper.make_node("MatMul", [f"h{i}", f"w{i}"], [f"h{i + 1}"]) for i in range(depth)]
            graph = helper.make_graph(nodes, "constants",
                                      [helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, width])],
                                      [helper.make_tensor_value_info(f"h{depth}", TensorProto.FLOAT, [1, width])])
            files[name] = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    except ImportError:
        print("onnx not installed: Constant-node graphs skipped", file=sys.stderr)
    return files


ORBAX_ROOT = "orbax/"  # one checkpoint directory, scanned (and reported) as one file


def hdf5_keras_orbax_files() -> dict[str, bytes]:
    """tf_model.h5 (h5py, Keras-2 layout), model.keras (Keras 3), an Orbax checkpoint."""
    import subprocess

    files: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        script = (
            "import os, sys, numpy as np\n"
            "out = sys.argv[1]\n"
            "try:\n"
            "    import h5py\n"
            "    with h5py.File(os.path.join(out, 'tf_model.h5'), 'w') as f:\n"
            "        f.attrs['layer_names'] = [b'bert']\n"
            "        for i in range(8):\n"
            "            f.create_dataset(f'bert/bert/layer_{i}/kernel:0', data=np.ones((1024, 1024), np.float32))\n"
            "except ImportError: pass\n"
            "try:\n"
            "    import keras\n"
            "    m = keras.Sequential([keras.Input((1024,))] + [keras.layers.Dense(1024) for _ in range(4)])\n"
            "    m.save(os.path.join(out, 'model.keras'))\n"
            "except ImportError: pass\n"
            "try:\n"
            "    import orbax.checkpoint as ocp\n"
            "    rng = np.random.default_rng(0)\n"
            "    tree = {f'layer{i}': {'kernel': rng.standard_normal((1024, 1024)).astype(np.float32)}\n"
            "            for i in range(4)}\n"
            "    ck = ocp.StandardCheckpointer()\n"
            "    ck.save(os.path.abspath(os.path.join(out, 'orbax')), tree)\n"
            "    ck.wait_until_finished()\n"
            "except ImportError: pass\n"
        )
        env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
        subprocess.run([sys.executable, "-c", script, tmp], env=env, check=True, capture_output=True)
        root = Path(tmp)
        for name, target in (("tf_model.h5", "hdf5/tf_model.h5"), ("model.keras", "keras/model.keras")):
            if (root / name).exists():
                files[target] = (root / name).read_bytes()
        for path in sorted((root / "orbax").rglob("*")) if (root / "orbax").exists() else []:
            if path.is_file():
                files[ORBAX_ROOT + path.relative_to(root / "orbax").as_posix()] = path.read_bytes()
    return files


def _gguf_onnx_numpy_files() -> dict[str, bytes]:
    """GGUF (a small header, and a 40,000-token vocabulary), ONNX (external data, inline), NumPy."""
    import io

    import numpy as np

    files: dict[str, bytes] = {}
    buf = io.BytesIO()
    np.savez(buf, **{f"layer{i}": np.ones((1024, 1024), np.float32) for i in range(8)})
    files["numpy/weights.npz"] = buf.getvalue()  # 32 MB, 8 members
    buf = io.BytesIO()
    np.save(buf, np.ones((4096, 1024), np.float32))
    files["numpy/embeddings.npy"] = buf.getvalue()  # 16 MB
    with tempfile.TemporaryDirectory() as tmp:
        try:
            import gguf

            for name, vocabulary in (("gguf/model-f16.gguf", 0), ("gguf-vocab/model-f16.gguf", 40_000)):
                path = Path(tmp) / "m.gguf"
                writer = gguf.GGUFWriter(path, "llama")
                writer.add_file_type(1)
                if vocabulary:
                    writer.add_array("tokenizer.ggml.tokens", [f"token-{i:06d}" for i in range(vocabulary)])
                for i in range(16):  # 32 MB
                    writer.add_tensor(f"blk.{i}.ffn_up.weight", np.ones((1024, 1024), np.float16))
                    writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(1024, np.float32))
                writer.write_header_to_file()
                writer.write_kv_data_to_file()
                writer.write_tensors_to_file()
                writer.close()
                files[name] = path.read_bytes()
        except ImportError:
            print("gguf not installed: GGUF skipped", file=sys.stderr)
        try:
            import onnx
            from onnx import TensorProto, helper, numpy_helper

            inits = [numpy_helper.from_array(np.ones((1024, 1024), np.float32), f"fc{i}.weight") for i in range(8)]
            nodes = [helper.make_node("MatMul", [f"h{i}", f"fc{i}.weight"], [f"h{i + 1}"]) for i in range(8)]
            graph = helper.make_graph(nodes, "mlp",
                                      [helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, 1024])],
                                      [helper.make_tensor_value_info("h8", TensorProto.FLOAT, [1, 1024])], inits)
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
            files["onnx-inline/model.onnx"] = model.SerializeToString()  # 32 MB, 8 initializers
            onnx.save(model, str(Path(tmp) / "model.onnx"), save_as_external_data=True, location="model.onnx_data")
            files["onnx/model.onnx"] = (Path(tmp) / "model.onnx").read_bytes()
            files["onnx/model.onnx_data"] = (Path(tmp) / "model.onnx_data").read_bytes()  # not a weight file
        except ImportError:
            print("onnx not installed: ONNX skipped", file=sys.stderr)
    return files


# the writers, by group (`--only`): each group's files are built by one function
GROUPS = {"training": training_files, "hdf5": hdf5_keras_orbax_files, "headers": _gguf_onnx_numpy_files,
          "exported": exported_files}


def weight_files(groups: tuple[str, ...] = tuple(GROUPS)) -> dict[str, bytes]:
    """One file per format, 16-32 MB each (144-160 MiB for the `-big` rows), built with the real libraries
    (skipped where absent)."""
    files: dict[str, bytes] = {}
    for group in groups:
        files.update(GROUPS[group]())
    return files


def per_file(hub: StandinHub, files: dict[str, bytes], work: Path) -> list[dict[str, object]]:
    from huggingface_hub import hf_hub_download

    from guard.cli import main

    hub.add_repo("bench/formats", files)
    report_path = work / "formats.json"
    main(["hub", "scan", "bench/formats", "-o", str(work / "warm-up.txt"), "--no-summary"])  # imports, sessions
    hub.reset_records()
    started = time.perf_counter()
    main(["hub", "scan", "bench/formats", "--format", "json", "-o", str(report_path), "--no-summary"])
    scan_seconds = time.perf_counter() - started
    stats = {f["path"]: f for f in json.loads(report_path.read_text())["extra"]["hub"]["repos"][0]["files"]}
    rows = []
    for path, stat in stats.items():  # each file the scan read, with the files it stands for
        if path.endswith(".json"):
            continue  # shard indexes: read whole, a few KB
        members = [n for n in files if n in (path, *companions(path, files)) or n.startswith(path + "/")]
        hub.reset_records()
        t0 = time.perf_counter()
        for name in members:
            hf_hub_download("bench/formats", name, cache_dir=str(work / "cache"))
        seconds = time.perf_counter() - t0
        # The stand-in records a GET once its body is sent, which can be after the client has it:
        # wait (briefly) for those records, so that they are not counted for the next file.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and sum(
                r.method == "GET" and r.bytes > 0 for r in hub.records) < len(members):
            time.sleep(0.01)
        records = list(hub.records)
        label = path if members == [path] else f"{path} (+{len(members) - (path in members)} file(s))"
        rows.append({
            "file": label, "size": sum(len(files[n]) for n in members),
            "scan_requests": stat["requests"], "scan_bytes": stat["bytes"],
            "download_requests": len(records), "download_bytes": sum(r.bytes for r in records),
            "download_seconds": seconds,
        })
    rows.append({"file": "(whole repo scan, wall)", "scan_seconds": scan_seconds})
    return rows


def companions(path: str, files: dict[str, bytes]) -> list[str]:
    """The files a scanned file stands for, which a download would fetch too: an IR's .bin, a TF
    bundle's data shards, a SavedModel's variables/ (ONNX external data is read by nobody: not counted)."""
    stem, _, suffix = path.rpartition(".")
    if suffix == "xml":
        return [n for n in files if n == f"{stem}.bin"]
    if suffix == "index":
        return [n for n in files if n.startswith(f"{stem}.data-")]
    if path.endswith("saved_model.pb"):
        folder = path.rpartition("/")[0]
        return [n for n in files if n.startswith(f"{folder}/variables/") or n == f"{folder}/fingerprint.pb"]
    return []


def audit(hub: StandinHub, repos: int, jobs: int, work: Path) -> dict[str, float]:
    from hub_standin import tiny_safetensors

    from guard.cli import main

    for i in range(repos):
        hub.add_repo(f"audit-org/model-{i:03d}", {"model.safetensors": tiny_safetensors("F32"),
                                                  "config.json": b'{"torch_dtype": "float32"}'})
    out = {}
    for j in (1, 8, jobs):
        hub.reset_records()
        started = time.perf_counter()
        rc = main(["hub", "scan", "--author", "audit-org", "--jobs", str(j), "--no-summary",
                   "--format", "json", "-o", str(work / f"audit-{j}.json")])
        seconds = time.perf_counter() - started
        assert rc == 0, rc
        out[f"jobs_{j}_seconds"] = seconds
        out[f"jobs_{j}_repos_per_s"] = repos / seconds
        out[f"jobs_{j}_requests"] = len(hub.records)
    # Floor: the listing, then ceil(N / jobs) waves of two round trips (model_info, then the files).
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--repos", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--only", action="append", choices=sorted(GROUPS),
                        help="build and measure only these writers' files (repeatable); no audit, no --write-docs")
    args = parser.parse_args()
    if args.only and args.write_docs:
        parser.error("--write-docs rewrites the whole table: run every group")
    with tempfile.TemporaryDirectory() as tmp, StandinHub(latency=args.latency) as hub:
        work = Path(tmp)
        os.environ.update(HF_ENDPOINT=hub.url, HF_HOME=str(work / "hf"), HF_HUB_DISABLE_TELEMETRY="1",
                          HF_HUB_DISABLE_XET="1", NO_PROXY="127.0.0.1,localhost", CI="true")
        os.environ.pop("HF_TOKEN", None)
        rows = per_file(hub, weight_files(tuple(args.only or GROUPS)), work)
        audit_figures = {} if args.only else audit(hub, args.repos, args.jobs, work)
    figures = {"latency_s": args.latency, "files": rows, "audit": audit_figures, "repos": args.repos,
               "jobs": args.jobs, "cpus": os.cpu_count()}
    print(json.dumps(figures, indent=2))
    if args.write_docs:
        write_docs(figures)
    return 0


def write_docs(f: dict) -> None:  # type: ignore[type-arg]
    """Replace (or add) the `## Hub` section of docs/benchmarks.md, leaving the others alone."""
    path = ROOT / "docs" / "benchmarks.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    lines = [
        "## Hub\n",
        f"`python bench/hub.py --write-docs`: the loopback stand-in Hub with {f['latency_s'] * 1000:.0f} ms added "
        f"to every request, the real huggingface_hub client, {f['cpus']} CPUs. Requests and bytes are counted by "
        "the stand-in. Targets: at most 2 requests and under 1 % of the bytes per weight file.\n",
        "| file | size | `hub scan` requests | `hub scan` bytes | share | `hf_hub_download` requests | bytes |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in f["files"]:
        if "size" not in row:
            continue
        share = 100 * row["scan_bytes"] / row["size"]
        lines.append(f"| `{row['file']}` | {row['size'] / MB:.1f} MiB | {row['scan_requests']} | "
                     f"{row['scan_bytes'] / 1024:.0f} KiB | {share:.2f} % | {row['download_requests']} | "
                     f"{row['download_bytes'] / MB:.1f} MiB |")
    wall = next(r["scan_seconds"] for r in f["files"] if "scan_seconds" in r)
    a, jobs = f["audit"], f["jobs"]
    lines += [
        "",
        f"Scanning the whole repository above ({sum(1 for r in f['files'] if 'size' in r)} weight files or "
        f"checkpoints, an index; warm) took {wall:.2f} s of wall time; "
        "the files are read concurrently, so it costs about the slowest file's round trips.",
        "",
        f"Organisation audit, `hub scan --author ORG` over {f['repos']} repositories "
        "(config.json + model.safetensors each):",
        "",
        "| jobs | wall | repos/s | requests | latency floor |",
        "|---:|---:|---:|---:|---:|",
        f"| 1 | {a['jobs_1_seconds']:.2f} s | {a['jobs_1_repos_per_s']:.1f} | {a['jobs_1_requests']} | |",
        *(f"| {j} | {a[f'jobs_{j}_seconds']:.2f} s | {a[f'jobs_{j}_repos_per_s']:.1f} | "
          f"{a[f'jobs_{j}_requests']} | {f['latency_s'] * (1 + 2 * -(-f['repos'] // j)):.2f} s |"
          for j in (8, jobs)),
        "",
        "Reading the figures: safetensors and torch zip files meet both targets at any size (one 64 KiB "
        "read-ahead block; a zip's end record and central directory come in one block back from the end). "
        "Legacy torch pickles: the pickle, read ahead from 64 KiB (through the readers' one Window), and a "
        "check of the first storage's count header, which for a state dict of a few tensors sits in the "
        "same block: 1 request (2 where the pickle outgrows the block; storage offsets come from the sizes "
        "the pickle declares). Flax msgpack has no index: the reader needs one "
        "64 KiB block after each skipped array, so its requests grow with the number of arrays "
        "(bounded per file; past the budget a file is CG401) and its byte share falls as files grow. "
        "This misses the 2-request target for msgpack by design of the format. "
        "GGUF: one request when the header fits in the first 64 KiB block; a header that keeps going "
        "(a 40,000-token vocabulary, ~900 KiB) costs a second, 1 MiB block: 2 requests, and ~1.1 MiB, "
        "which is under 1 % of any file above ~110 MiB (real vocabularies come with GB-sized weights). "
        "ONNX with external data (torch.onnx.export's default, Optimum's layout): the graph file is "
        "read in one request and the data file is never touched. ONNX with inline weights and `.npz` "
        "archives have no index: one request per initializer or member larger than a block, as msgpack. "
        "The audit's floor is the "
        "listing plus two round trips per wave of `jobs` repositories; the rest of the wall time is CPU "
        "on this 2-CPU machine, where the stand-in and the client share one Python process.",
        "",
        "The same audit while the Hub rate-limits it (429 with `Retry-After` to every third request, with and "
        "without `--max-rps`), the reviewer's kill tests and its latencies under a burst of 50 deliveries come "
        "from `bench/hub_service.py`; their figures are in "
        "[reliability.md](reliability.md#the-hub-reviewer-kills-rate-limits-bursts).",
        "",
        "The formats of issue 16: TorchScript and `.pt2` archives are zips (their end record and directory "
        "in one block back from the end, then the pickles or the JSON configs): 2 requests. An ExecuTorch "
        "`.pte` keeps its flatbuffer program before the constant segment: 1. OpenVINO IR: the `.xml` alone "
        "(each Constant's type, shape, offset and size), in one request; the `.bin` is checked against the "
        "listing's size and never fetched, so a 144 MiB IR costs 16 KiB. A TensorFlow bundle is read from its "
        "`.index` (a LevelDB table of a few hundred bytes): 1 request, the data shards never. These meet both "
        "targets. Three cannot meet the 2-request one, by where their formats put the metadata: none has an "
        "index, and their records sit between payloads of MBs, so each record after a payload larger than the "
        "64 KiB block costs one request (a request is one range, and skipping a payload means not fetching it). "
        "ONNX graphs whose weights are `Constant` nodes (paddle2onnx) cost the graph's head, the model's fields "
        "after the graph (`opset_import`), and one request after each large Constant, as inline initializers "
        "do: a Constant's attribute ends after its tensor's raw data, and the walk's return to the tensor is "
        "served from the block the readers' Window keeps (it cost a second request per Constant, 17 for the 8 "
        "Constants above). TFLite costs one request per large buffer (the converter writes each Buffer table "
        "just before its bytes), and one for the table of empty buffers it writes at the end of the file. A "
        "Core ML package costs Manifest.json and one request per large blob in weight.bin (each blob's "
        "64-byte metadata record follows the previous blob's data; small blobs, the biases, are read through "
        "in the same block). Its ML program spec names every blob's offset and type, so a reader of the spec "
        "could do with 2 or 3 requests, but this one reads the records that coremltools reads. All three stay "
        "under 1 % of the bytes above 100 MiB (the `-big` rows: 144 to 160 MiB).",
        "",
        "HDF5, Keras and Orbax: an HDF5 file keeps each dataset's object header next to its "
        "data, so h5py's walk costs about one 64 KiB read-ahead block per group of datasets (the "
        "tf_model.h5 above: 8 datasets of 4 MiB); the requests grow with the number of datasets, the "
        "byte share falls as they grow. A .keras archive adds its zip directory and two small JSON "
        "members to the same walk of its stored model.weights.h5. These files do not meet the "
        "2-request target (set for GGUF and ONNX) by the layout of the format. An Orbax checkpoint is "
        "one row: its metadata JSON files and the small OCDBT files (manifests and B-tree nodes, each "
        "fetched whole) are read, the array chunk files never. One h5py worker process serves a scan, one "
        "HDF5 file at a time, so HDF5 files are read one after another; the whole-repository wall time "
        "above includes its start (~0.3 s) and tensorstore's import.",
        "",
    ]
    section = "\n".join(lines) + "\n"
    pattern = re.compile(r"^## Hub\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


if __name__ == "__main__":
    raise SystemExit(main())
