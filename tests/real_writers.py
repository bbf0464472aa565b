"""Keras 3 and Orbax files written by the real libraries, in one child process, with references.

Keras and JAX take seconds to import, so a test module calls ``build(kind, out)``
once (a module-scoped fixture); the child writes the files and ``reference.json``:
for every file or checkpoint, {name: [safetensors code, shape]} as the library's
own reader reports it (h5py for the h5 members, orbax's ``metadata()`` and
tensorstore for checkpoints).

    python tests/real_writers.py keras|orbax OUT_DIR
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
POLICIES = ("float32", "mixed_float16", "mixed_bfloat16", "bfloat16")


_BUILT: dict[str, tuple[Path, dict[str, Any]]] = {}


def built(kind: str, tmp_path_factory: Any) -> tuple[Path, dict[str, Any]]:
    """``build`` once per test session (the Keras, Orbax and Hub tests share the files: read only)."""
    if kind not in _BUILT:
        out = tmp_path_factory.mktemp(kind)
        _BUILT[kind] = out, build(kind, out)
    return _BUILT[kind]


def build(kind: str, out: Path) -> dict[str, Any]:
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(Path(__file__)), kind, str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference: dict[str, Any] = json.loads((out / "reference.json").read_text())
    return reference


def h5_listing(h5: Any) -> dict[str, list[Any]]:
    """What h5py reports: path -> [code, shape]; Keras' opaque bf16 by its dtype attribute."""
    from guard.dtypes import NUMPY_NAMES

    out: dict[str, list[Any]] = {}

    def visit(name: str, obj: Any) -> None:
        if hasattr(obj, "dtype") and obj.shape is not None:
            declared = obj.attrs.get("dtype")
            numpy_name = declared if obj.dtype.kind == "V" and isinstance(declared, str) else obj.dtype.name
            out[name] = [NUMPY_NAMES.get(numpy_name, numpy_name), list(obj.shape)]

    h5.visititems(visit)
    return out


def write_keras(out: Path) -> dict[str, Any]:
    import io
    import zipfile

    import h5py
    import keras

    reference: dict[str, Any] = {}
    for policy in POLICIES:
        keras.config.set_dtype_policy(policy)
        inputs = keras.Input((8,))
        x = keras.layers.Dense(16, name="dense_in")(inputs)
        x = keras.layers.LayerNormalization(name="norm")(x)
        outputs = keras.layers.Dense(4, name="dense_out")(x)
        functional = keras.Model(inputs, outputs)
        sequential = keras.Sequential([keras.Input((8,)), keras.layers.Embedding(10, 8),
                                       keras.layers.Dense(3)])
        sequential.save(out / f"seq_{policy}.keras")
        functional.save(out / f"fn_{policy}.keras")
        functional.save_weights(out / f"fn_{policy}.weights.h5")
        for name in (f"seq_{policy}.keras", f"fn_{policy}.keras"):
            with zipfile.ZipFile(out / name) as archive:
                member = archive.getinfo("model.weights.h5")
                reference[name] = {"compress_type": member.compress_type,
                                   "tensors": h5_listing(h5py.File(io.BytesIO(archive.read(member)), "r"))}
        with h5py.File(out / f"fn_{policy}.weights.h5", "r") as h5:
            reference[f"fn_{policy}.weights.h5"] = {"tensors": h5_listing(h5)}
    keras.config.set_dtype_policy("float32")
    big = keras.Sequential([keras.Input((64,))] + [keras.layers.Dense(64) for _ in range(4)])
    big.save_weights(out / "sharded.weights.json", max_shard_size=0.00002)  # ~20 KB shards
    reference["sharded"] = sorted(p.name for p in out.glob("sharded*"))
    return reference


def write_orbax(out: Path) -> dict[str, Any]:
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp
    import tensorstore as ts
    from flax import nnx

    from guard.dtypes import NUMPY_NAMES

    class Model(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.embed = nnx.Embed(32, 16, rngs=rngs, param_dtype=jnp.bfloat16)
            self.dense = nnx.Linear(16, 16, rngs=rngs, param_dtype=jnp.bfloat16)
            self.norm = nnx.LayerNorm(16, rngs=rngs)
            self.head = nnx.Linear(16, 4, rngs=rngs)

    state = nnx.state(Model(nnx.Rngs(0)))
    rng = np.random.default_rng(0)
    tree = {"params": {"w": jnp.asarray(rng.standard_normal((300, 300)), jnp.float32),  # a > 64 KiB chunk
                       "b": jnp.zeros((300,), jnp.float16)},
            "step": 7, "ids": np.arange(5, dtype=np.int64)}
    checkpoints = {
        "nnx_ocdbt": (ocp.StandardCheckpointer(), state),
        "nnx_zarr": (ocp.Checkpointer(ocp.StandardCheckpointHandler(use_ocdbt=False)), state),
        "tree_ocdbt": (ocp.StandardCheckpointer(), tree),
        "tree_zarr3": (ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False, use_zarr3=True)), tree),
    }
    reference: dict[str, Any] = {}
    for name, (checkpointer, value) in checkpoints.items():
        path = (out / name).absolute()
        if isinstance(checkpointer.handler if hasattr(checkpointer, "handler") else None,
                      ocp.PyTreeCheckpointHandler):
            checkpointer.save(path, args=ocp.args.PyTreeSave(value))
        else:
            checkpointer.save(path, value)
        if hasattr(checkpointer, "wait_until_finished"):
            checkpointer.wait_until_finished()
        reference[name] = _orbax_reference(path, ocp, ts, NUMPY_NAMES)
    manager = ocp.CheckpointManager((out / "manager").absolute())
    manager.save(3, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
    manager.wait_until_finished()
    reference["manager/3"] = {f"state.{k}": v for k, v in
                              _orbax_reference((out / "manager" / "3" / "state").absolute(), ocp, ts,
                                               NUMPY_NAMES).items()}
    return reference


def _orbax_reference(path: Path, ocp: Any, ts: Any, numpy_names: dict[str, str]) -> dict[str, list[Any]]:
    """orbax's own metadata (dtype, shape per leaf), checked against tensorstore's open of each array."""
    import jax

    # the handler's own metadata(): StandardCheckpointer.metadata() logs and returns None on errors
    tree = ocp.PyTreeCheckpointHandler().metadata(path)
    tree = getattr(tree, "tree", tree)
    out: dict[str, list[Any]] = {}
    for keypath, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not hasattr(leaf, "dtype"):
            continue
        name = ".".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in keypath)
        code = numpy_names.get(str(leaf.dtype), str(leaf.dtype))
        out[name] = [code, list(leaf.shape)]
        ocdbt = (path / "manifest.ocdbt").exists()
        kvstore = ({"driver": "ocdbt", "base": f"file://{path}/", "path": name} if ocdbt
                   else {"driver": "file", "path": f"{path}/{name}/"})
        driver = "zarr3" if (path / name / "zarr.json").exists() else "zarr"
        store = ts.open({"driver": driver, "kvstore": kvstore}, open=True).result()
        if [numpy_names.get(store.dtype.name, store.dtype.name), list(store.shape)] != out[name]:
            raise ValueError(f"orbax metadata and tensorstore disagree on {name}")
    return out


def write_orbax_mutants(out: Path, count: int) -> dict[str, Any]:
    """Seeded byte mutations of one metadata file of real checkpoints, and orbax's verdict on each:
    {mutant: {name: [code, shape]}} or the reason orbax's metadata() / tensorstore refused it."""
    import random
    import shutil

    import numpy as np
    import orbax.checkpoint as ocp
    import tensorstore as ts
    from fuzz_inputs import apply_all, random_mutations

    from guard.dtypes import NUMPY_NAMES

    tree = {"params": {"w": np.ones((3, 4), np.float32), "b": np.zeros((4,), np.float16)},
            "layers": [{"k": np.ones((2, 2), np.int32)}], "step": 3}
    bases = {}
    for name, zarr3 in (("zarr2", False), ("zarr3", True)):
        path = (out / f"base-{name}").absolute()
        ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False, use_zarr3=zarr3)).save(
            path, args=ocp.args.PyTreeSave(tree))
        bases[name] = path
    rng = random.Random(0)
    reference: dict[str, Any] = {}
    for i in range(count):
        base = bases["zarr3" if i % 2 else "zarr2"]
        target = rng.choice(["_METADATA", "params.w/" + ("zarr.json" if i % 2 else ".zarray")])
        mutant = out / f"mutant-{i:04d}"
        shutil.copytree(base, mutant)
        data = (mutant / target).read_bytes()
        (mutant / target).write_bytes(apply_all(data, random_mutations(rng, data, hot=len(data))))
        try:
            reference[mutant.name] = _orbax_reference(mutant.absolute(), ocp, ts, NUMPY_NAMES)
        except Exception as exc:  # noqa: BLE001 - the reference's refusal is the datum
            reference[mutant.name] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return reference


def main(argv: list[str]) -> int:
    kind, out = argv[0], Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    if kind.startswith("orbax-mutants"):
        sys.path.insert(0, str(HERE))
        reference = write_orbax_mutants(out, int(kind.rpartition("-")[2]))
    else:
        reference = write_keras(out) if kind == "keras" else write_orbax(out)
    (out / "reference.json").write_text(json.dumps(reference, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
