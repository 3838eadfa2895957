"""Frontend: load a user's model file (load.py) and trace it (trace.py: ``trace``) into the
torch-free OpGraph (graph.py).

The names below load lazily, so that importing ``autoshard.frontend.graph`` (the data type the
later stages read, also on the torch-free IOPDDL path) does not load torch. ``trace`` is not among
them: a package attribute named like its submodule is the submodule once that is imported, so
import it from ``autoshard.frontend.trace``.
"""

from __future__ import annotations

from autoshard import lazy_exports

_EXPORTS = {
    "node_caller": "autoshard.frontend.call",
    "run_graph": "autoshard.frontend.call",
    "LoadedModel": "autoshard.frontend.load",
    "load_model": "autoshard.frontend.load",
    "graph_table": "autoshard.frontend.table",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
