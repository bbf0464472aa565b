"""MaxText's own forward on checkpoints written by `convert --to maxtext`; run by a Python >= 3.12 that has
MaxText installed (`make maxtext-venv`), never imported by the tests' own interpreter.

stdin: a JSON list of {"flags": [...], "ids": [[...]], "logits": "reference.npy", "name": ...};
stdout: one JSON line, {name: max |MaxText - reference| / max |reference|}.
"""

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import maxtext
import numpy as np
from maxtext.configs import pyconfig
from maxtext.utils import model_creation_utils

FP32 = ["weight_dtype=float32", "dtype=float32", "matmul_precision=highest", "float32_logits=true",
        "float32_qk_product=true", "attention=dot_product", "per_device_batch_size=1", "enable_checkpointing=false",
        "skip_jax_distributed_system=true", "tokenizer_type=huggingface", "tokenizer_path=none"]


def relative_error(case: dict, work: Path) -> float:
    ids = jnp.asarray(case["ids"])
    base = str(Path(maxtext.__file__).parent / "configs" / "base.yml")
    argv = ["", base, *case["flags"], *FP32, f"run_name={case['name']}", f"max_target_length={ids.shape[1]}",
            f"max_prefill_predict_length={ids.shape[1]}", f"base_output_directory={work}"]
    config = pyconfig.initialize(argv)
    model, mesh = model_creation_utils.from_pretrained(config)
    with jax.set_mesh(mesh):
        logits = model(ids, jnp.arange(ids.shape[1])[None], decoder_segment_ids=jnp.ones_like(ids),
                       enable_dropout=False)
    got = np.asarray(logits[0] if isinstance(logits, tuple) else logits, np.float32)
    want = np.load(case["logits"])
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def main() -> int:
    cases = json.load(sys.stdin)
    print(json.dumps({c["name"]: relative_error(c, Path(c["logits"]).parent / "maxtext-run") for c in cases}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
