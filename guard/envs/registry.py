"""The environments targets run in when their pins clash with ours: one literal row each.

A row says what an environment holds and why it is apart; the target table (``guard.targets``) names a
row by its name.  The constraints file is package data beside this module (``guard/envs/<name>.txt``),
the same file ``make test`` builds from; every pin in it is what the target's tests ran with.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from guard.records import Record


class Environment(Record):
    name: str
    constraints: str  # package data: guard/envs/<constraints>
    python: str  # "3.12": that minor version; "": any Python ckpt-guard runs on (>= 3.10)
    requirements: tuple[str, ...]  # what `ckpt-guard env install NAME` asks pip for, under the constraints
    module: str  # the import name whose presence says the library is there
    distribution: str  # the library's distribution, whose version is checked
    checked: tuple[str, ...]  # the library versions the target was checked with (another one runs, warned)
    # "venv": a virtual environment of its own; "lib": a --no-deps --target folder put on this Python's path
    # (beside a Python that has its dependencies); "overlay": a venv holding only the pins that differ from
    # the Python that runs ckpt-guard, whose site-packages a .pth file adds after its own (its torch, whichever
    # build the user chose, is the overlay's)
    kind: str
    why: str  # one line: why it cannot run in ckpt-guard's own environment
    # a version of ``distribution`` the target cannot run on at all, whatever the warning ("5": transformers 5
    # removed the Flax models); such a process or named Python is not used
    refuses_major: tuple[int, ...] = ()
    env: Mapping[str, str] = MappingProxyType({})  # the worker's environment variables
    # a "lib" folder's neighbours: what the Python running ckpt-guard must hold for the library to import
    beside: tuple[str, ...] = ()
    # what the worker imports there: `env install` imports each in the built environment before it says ready
    imports: tuple[str, ...] = ()
    # "module:function" run there after the imports: a tiny forward through the library, as the worker runs it
    smoke: str = ""
    # distributions an overlay takes from the Python running ckpt-guard, whichever build the user chose (torch:
    # PyPI's Linux torch is the CUDA build, GBs of nvidia-* wheels for a check that runs on the CPU): never
    # installed, never pinned in the constraints; absent there, `env install` says how to install them
    borrows: tuple[str, ...] = ()
    # requirements installed without their own dependencies (keras-hub's tensorflow-text would install a second
    # TensorFlow); what the worker needs of those dependencies is in ``requirements``
    no_deps: tuple[str, ...] = ()


ENVIRONMENTS: dict[str, Environment] = {
    "tf4": Environment(
        name="tf4", constraints="tf4.txt", python="", requirements=("transformers",),
        module="transformers", distribution="transformers", checked=("4.57.6",), kind="overlay",
        why="transformers 5 removed its Flax models (parity's Flax side, --to flax's reference): 4.57 is the last "
            "line that has them",
        refuses_major=(5, 6, 7, 8, 9),
        imports=("numpy", "jax", "flax", "torch", "transformers", "transformers.modeling_flax_utils"),
        borrows=("torch",)),
    "tunix": Environment(
        # kernels: as EasyDeL's (below), transformers 5.12 refuses the 0.19 of the Python this overlays at import
        name="tunix", constraints="tunix.txt", python="", requirements=("google-tunix", "jax", "flax", "kernels"),
        module="tunix", distribution="google-tunix", checked=("0.1.7",), kind="overlay",
        why="google-tunix 0.1.7 pins safetensors < 0.8 (ours is 0.8)",
        imports=("numpy", "jax", "flax.nnx", "torch", "tunix.models.llama3.model", "tunix.models.llama3.params",
                 "tunix.models.qwen3.model", "tunix.models.qwen3.params", "transformers.activations"),
        borrows=("torch",)),
    "keras-hub": Environment(
        name="keras-hub", constraints="keras-hub.txt", python="",
        # keras-hub's own requirements but tensorflow-text (a second TensorFlow, for its tokenizers' TF ops)
        # (kagglehub, which it imports only to download a preset, is left out too: the worker reads a local folder)
        requirements=("keras-hub", "keras", "sentencepiece", "tokenizers", "absl-py", "regex", "rich", "packaging",
                      "numpy"),
        module="keras_hub", distribution="keras-hub", checked=("0.32.0",), kind="overlay",
        why="keras-hub requires tensorflow-text, which would install a second TensorFlow: keras-hub without its "
            "dependencies, then the rest of what it imports (keras, sentencepiece) beside this Python's jax",
        env={"KERAS_BACKEND": "jax"}, imports=("numpy", "jax", "keras", "keras_hub", "sentencepiece"),
        smoke="guard.worker.keras_hub_side:smoke", no_deps=("keras-hub",)),
    "easydel": Environment(
        # kernels: transformers 5.5 imports it wherever it is installed (the Python this overlays has 0.19, which
        # its hub_kernels refuses at import: "Either a revision or a version must be specified"), so the overlay
        # holds the one 5.5 declares (kernels < 0.13)
        name="easydel", constraints="easydel.txt", python="", requirements=("easydel", "Pillow", "kernels"),
        module="easydel", distribution="easydel", checked=("0.3.0",), kind="overlay",
        why="easydel 0.3.0 pins jax ~= 0.9, flax == 0.12.3 and transformers ~= 5.5, and imports Pillow without "
            "declaring it",
        imports=("numpy", "jax", "flax.nnx", "torch", "PIL", "easydel", "easydel.modules.auto",
                 "transformers.activations"),
        borrows=("torch",)),
    "maxtext": Environment(
        name="maxtext", constraints="maxtext.txt", python="3.12", requirements=("maxtext[tpu]",),
        module="maxtext", distribution="maxtext", checked=("0.2.5",), kind="venv",
        why="MaxText 0.2.5 needs Python >= 3.12 and transformers >= 5.17",
        imports=("numpy", "jax", "flax.nnx", "maxtext", "maxtext.configs.pyconfig",
                 "maxtext.utils.model_creation_utils")),
}
