"""The one resolver of the tables that name code: ``"package.module:name"`` -> that object, its module imported
on first use.  The readers, the reporters, the diff views, the rules that need a format, the fix actions, the
dequantizers, the trainers' readers and conversion sources, the targets' writers and worker sides and the
commands are named in tables, not imported up front (a table in a low layer names code of a higher one without
importing it).  ``tests/test_architecture.py`` resolves every entry of every table and checks each against the
signature its caller relies on.

``importlib.import_module`` would import ``importlib`` itself on the pre-commit hook's line; the
builtin ``__import__`` and ``sys.modules`` do the same without it.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: the hook imports this module
if TYPE_CHECKING:  # annotations only
    from typing import Any


def resolve(dotted: str) -> Any:  # what a table names: a reader, a rule, a command, an action, a writer, a side
    """``"package.module:name"`` -> ``getattr(importlib.import_module(module), name)``; ``"package.module"`` ->
    the module itself."""
    module, _, name = dotted.partition(":")
    __import__(module)
    loaded = sys.modules[module]
    return getattr(loaded, name) if name else loaded
