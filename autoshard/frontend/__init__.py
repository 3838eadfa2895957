"""Frontend: load a user's model file and trace it into the torch-free OpGraph (graph.py).

The tracing names load lazily, so that importing ``autoshard.frontend.graph`` (the data type the
later stages read) does not load the tracer.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "node_caller": "autoshard.frontend.call",
    "run_graph": "autoshard.frontend.call",
    "LoadedModel": "autoshard.frontend.load",
    "load_model": "autoshard.frontend.load",
    "graph_table": "autoshard.frontend.table",
    "trace": "autoshard.frontend.trace",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'autoshard.frontend' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The tracing names (loaded lazily) and the module's own."""
    return sorted(set(globals()) | set(_EXPORTS))
