"""Keras 3 dtype policies are declarations: each layer's policy against the variables stored for it.

Written and loaded by real Keras 3 (JAX backend) in one child process (this file run as a
script): honest files (a global ``bfloat16`` / ``mixed_bfloat16`` policy, per-layer
``dtype=...``, a Sequential whose layers differ from the model's own policy) and planted
ones, where config.json inside the archive is edited to declare a policy over variables
stored in another dtype, as a hand-edited or mis-converted file would.  The child loads
each file with ``keras.saving.load_model`` and reports the dtypes of the variables Keras
built: that is what the policy does on load, and what CG103 says.

    KERAS_BACKEND=jax python tests/test_keras_policies.py OUT_DIR
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

if __name__ != "__main__":
    import pytest
    from scanning import codes, json_scan

    pytest.importorskip("h5py")
    if importlib.util.find_spec("keras") is None:
        pytest.skip("keras is not installed", allow_module_level=True)
    pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


def _replant(path: Path, edit: Any) -> None:
    """Rewrite config.json inside a .keras archive (members stay stored, as Keras writes them)."""
    data = path.read_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as src:
        config = json.loads(src.read("config.json"))
        edit(config)
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as dst:
            for info in src.infolist():
                dst.writestr(info, json.dumps(config) if info.filename == "config.json" else src.read(info))
    path.write_bytes(buffer.getvalue())


def _layers_policy(name: str) -> Any:
    def edit(config: dict[str, Any]) -> None:
        for layer in config["config"]["layers"]:
            if layer["class_name"] != "InputLayer":
                layer["config"]["dtype"]["config"]["name"] = name
    return edit


def _model_policy(name: str) -> Any:
    def edit(config: dict[str, Any]) -> None:
        config["config"]["dtype"]["config"]["name"] = name
    return edit


def write(out: Path) -> None:
    import keras

    def seq(policy: str | None = None, **layer: Any) -> Any:
        keras.config.set_dtype_policy(policy or "float32")
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, **layer),
                                  keras.layers.LayerNormalization(**layer), keras.layers.Dense(4, **layer)])
        keras.config.set_dtype_policy("float32")
        return model

    inputs = keras.Input((8,))
    x = keras.layers.Dense(16, name="dense_in", dtype="bfloat16")(inputs)
    x = keras.layers.LayerNormalization(name="norm", dtype="float32")(x)
    mixed = keras.Model(inputs, keras.layers.Dense(4, name="dense_out", dtype="mixed_float16")(x))
    files = {"honest-global-bf16": seq("bfloat16"), "honest-global-mixed-bf16": seq("mixed_bfloat16"),
             "honest-layers-bf16": seq(dtype="bfloat16"), "honest-per-layer-mix": mixed,
             "planted-bf16-over-fp32": seq(), "planted-fp16-over-fp32": seq(),
             "planted-fp32-over-bf16": seq("bfloat16"), "planted-model-level-only": seq()}
    plants = {"planted-bf16-over-fp32": _layers_policy("bfloat16"),
              "planted-fp16-over-fp32": _layers_policy("float16"),
              "planted-fp32-over-bf16": _layers_policy("float32"),
              "planted-model-level-only": _model_policy("bfloat16")}
    loaded = {}
    for name, model in files.items():
        path = out / name / "model.keras"
        path.parent.mkdir(parents=True)
        model.save(path)
        if name in plants:
            _replant(path, plants[name])
        back = keras.saving.load_model(path)
        loaded[name] = sorted({str(v.dtype) for v in back.weights})
    (out / "loaded.json").write_text(json.dumps(loaded))


if __name__ == "__main__":
    write(Path(sys.argv[1]))
    raise SystemExit(0)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[str]]]:
    out = tmp_path_factory.mktemp("keras-policies")
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, __file__, str(out)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads((out / "loaded.json").read_text())


# file -> (what load_model builds, exit code, CG103 severities): --expect uniform, so only the
# dtype declarations and mixes are judged
VERDICTS = {
    "honest-global-bf16": (["bfloat16"], 0, []),
    "honest-global-mixed-bf16": (["float32"], 0, []),  # mixed_*: float32 variables, 16-bit compute
    "honest-layers-bf16": (["bfloat16"], 0, []),  # the model's own policy (float32) builds no variable
    "honest-per-layer-mix": (["bfloat16", "float32"], 1, []),  # CG102 (a real mix), no CG103
    "planted-bf16-over-fp32": (["bfloat16"], 1, ["error"]),  # loaded rounded down to bf16
    "planted-fp16-over-fp32": (["float16"], 1, ["error"]),
    "planted-fp32-over-bf16": (["float32"], 0, ["warning"]),  # widened on load
    "planted-model-level-only": (["float32"], 0, []),  # the layers' policies build the variables
}


@pytest.mark.parametrize("name", list(VERDICTS))
def test_layer_policies_against_stored_variables(written: tuple[Path, dict[str, list[str]]], name: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out, loaded = written
    built, exit_code, severities = VERDICTS[name]
    assert loaded[name] == built  # what Keras does with the declaration
    rc, report = json_scan(capsys, str(out / name), "--expect", "uniform")
    assert rc == exit_code, report["findings"]
    assert [f["severity"] for f in report["findings"] if f["code"] == "CG103"] == severities
    if name == "honest-per-layer-mix":
        assert codes(report) == {"CG102"}


def test_cg103_names_the_layer_the_policy_and_what_load_does(written: tuple[Path, dict[str, list[str]]],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = written
    _rc, report = json_scan(capsys, str(out / "planted-bf16-over-fp32"))
    (finding,) = [f for f in report["findings"] if f["code"] == "CG103"]
    # the two Dense layers; LayerNormalization's fp32 variables match the default keep-fp32 "*norm*"
    assert "2 layer(s) the Keras dtype policy 'bfloat16'" in finding["message"]
    assert "4 stored variable(s) are fp32" in finding["message"]
    assert "load_model casts them to bf16" in finding["message"]
    assert finding["tensor"] == "layers/dense/vars/0"
