"""A module's attribute, its module imported on first use: the readers, the reporters, the rules that
need a format, the command groups and the fix actions are named in tables, not imported up front.

``importlib.import_module`` would import ``importlib`` itself on the pre-commit hook's line; the
builtin ``__import__`` and ``sys.modules`` do the same without it.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: the hook imports this module
if TYPE_CHECKING:  # annotations only
    from typing import Any


def attribute(module: str, name: str) -> Any:  # what a table names: a reader, a rule, a command, an action
    """``getattr(importlib.import_module(module), name)``."""
    __import__(module)
    return getattr(sys.modules[module], name)
