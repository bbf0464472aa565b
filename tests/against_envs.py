"""The environments `parity --against` runs its stacks in: the managed ones (``guard.envs``), built when missing
by `ckpt-guard env install`, as `make test` builds them (CKPT_GUARD_HOME=.envs).  A failed build fails the test
with its one line: nothing is skipped silently.
"""

from __future__ import annotations

import os
from pathlib import Path

from guard.envs.build import install
from guard.envs.find import Found, find_managed
from guard.envs.registry import ENVIRONMENTS


def ensure(target: str) -> Found:
    """The managed environment of ``target`` (an --against stack or "tf4"), built first when missing."""
    _not_pending(target)
    env = ENVIRONMENTS[target]
    found = find_managed(env)
    if found is None:
        install(env, say=lambda line: None)
        found = find_managed(env)
    assert found is not None, target
    return found


def managed_python(target: str) -> Path | None:
    """The managed environment's Python when it is built, else None (a test that needs it says so)."""
    _not_pending(target)
    found = find_managed(ENVIRONMENTS[target])
    return found.python if found is not None else None


def _not_pending(target: str) -> None:
    """`make test` runs most of the main session while the other lane builds tunix, EasyDeL and MaxText
    (CKPT_GUARD_TEST_PENDING_ENVS): a test there that needs one would build a second copy, or find none."""
    pending = os.environ.get("CKPT_GUARD_TEST_PENDING_ENVS", "").split(",")
    if target in pending:
        raise AssertionError(f"{target}'s environment is still being built beside this session: a test that "
                             "needs it belongs in the Makefile's ENV_TESTS (run once the environments are built)")
