"""Staging a fix: the action's function, named in the one table of actions (``guard.fixes.ACTIONS``).

An action reads the model directory, writes only into ``ctx.staging`` (through
``guard.write`` for weights), verifies what it wrote, and returns ``Staged``; it never
touches a final name.  ``guard.fix.apply`` publishes.  Modules are imported on first use:
a config rewrite loads no numpy, a weight fix loads no transformers.
"""

from __future__ import annotations

from guard.fix.context import ActionContext, Staged
from guard.fixes import ACTIONS, Fix
from guard.lazy import resolve

__all__ = ["ACTIONS", "stage"]


def stage(fix: Fix, ctx: ActionContext) -> Staged:
    staged: Staged = resolve(ACTIONS[fix.action])(fix, ctx)
    return staged
