"""The registry: each action's name -> the module and function that stage it.

An action reads the model directory, writes only into ``ctx.staging`` (through
``guard.write`` for weights), verifies what it wrote, and returns ``Staged``; it never
touches a final name.  ``guard.fix.apply`` publishes.  Modules are imported on first use:
a config rewrite loads no numpy, a weight fix loads no transformers.
"""

from __future__ import annotations

from guard.fix.context import ActionContext, Staged
from guard.fixes import Fix
from guard.lazy import attribute

ACTIONS: dict[str, tuple[str, str]] = {
    "config-dtype": ("guard.fix.actions.config_dtype", "stage_config_dtype"),
    "config-field": ("guard.fix.actions.config_dtype", "stage_config_field"),
    "safetensors-copy": ("guard.fix.actions.safetensors_copy", "stage_safetensors_copy"),
    "set-cast": ("guard.fix.actions.cast", "stage_set_cast"),
    "variant-add": ("guard.fix.actions.cast", "stage_variant_add"),
    "variant-recast": ("guard.fix.actions.cast", "stage_variant_recast"),
    "index-rebuild": ("guard.fix.actions.index", "stage_index_rebuild"),
    "copy-regenerate": ("guard.fix.actions.copies", "stage_copy_regenerate"),
    "add-copy": ("guard.fix.actions.copies", "stage_add_copy"),
}


def stage(fix: Fix, ctx: ActionContext) -> Staged:
    module, function = ACTIONS[fix.action]
    staged: Staged = attribute(module, function)(fix, ctx)
    return staged
