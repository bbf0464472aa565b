"""JAX's persistent compilation cache for parity's Flax side, in ckpt-guard's folder of the user's cache directory.

transformers' Flax models run eagerly: every jax operation of a pass is compiled once per shape and dtype (a
tiny Llama's Flax passes: about 130 XLA programs, most of the Flax side's time after its imports), and a new
process compiles them all again.  JAX keeps compiled programs across processes in a folder: ``jax-cache`` in
the folder ``guard.envs.home.cache_root`` names (``$CKPT_GUARD_HOME``, else ``$XDG_CACHE_HOME/ckpt-guard``,
``~/.cache/ckpt-guard``; the platform's cache folder elsewhere), beside the managed environments.  JAX's key
holds the program, the jax and jaxlib versions, the backend and the compile options, so a hit runs the program
a compile would have made: the outputs are the same bits.

Every program is kept (JAX's default keeps only those that took a second to compile, and an eager pass's take
milliseconds each), the folder bounded by JAX's own least-recently-used eviction (``MAX_BYTES``).  A cache folder
the user set for JAX (``JAX_COMPILATION_CACHE_DIR``) is used instead, with its own bound; a folder that cannot
be made leaves the cache off, and parity compiles as before.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from guard.envs.home import cache_root

FOLDER = "jax-cache"
MAX_BYTES = 512 * 2**20


def cache_dir() -> Path:
    return cache_root() / FOLDER


def enable() -> Path | None:
    """Turns the cache on for this process (before its first compile); the folder it uses, or None."""
    import jax

    own = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]  # an option jax's stub lacks
    if own:
        folder = Path(own)
    else:
        folder = cache_dir()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        jax.config.update("jax_compilation_cache_dir", str(folder))
        if importlib.util.find_spec("filelock") is not None:  # JAX's eviction locks the folder with it
            jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return folder
