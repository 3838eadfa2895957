"""Frontend: load a user's model file and trace it into the torch-free OpGraph."""

from autoshard.frontend.call import node_caller, run_graph
from autoshard.frontend.load import LoadedModel, load_model
from autoshard.frontend.table import graph_table
from autoshard.frontend.trace import trace

__all__ = ["LoadedModel", "graph_table", "load_model", "node_caller", "run_graph", "trace"]
