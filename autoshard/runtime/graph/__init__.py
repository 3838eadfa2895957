"""A plan lowered, per rank, to one ``torch.fx.GraphModule``: the model's ops on local pieces and
the plan's collectives as explicit nodes.

- ``lower.py`` builds the program from (traced graph, plan, mesh groups): placeholders for the
  local pieces of the parameters and buffers, then the model's inputs; every op as its traced
  call on local tensors (``emit.py``: the traced target itself, with the plan's local
  attributes); before each operand its edge's reshard; hidden edges' gathers issued ahead.
- ``calls.py`` holds the small callables the program's ``call_function`` nodes name: the
  reshard of an edge (an autograd Function: forward steps, gradient steps), the issue of a
  hidden edge's steps ahead, and the ops that need more than their traced call (a mean over a
  global count, experts, causal rows, kept and re-gathered ops).
- ``segments.py`` runs a recomputed block: its own GraphModule under ``torch.utils.checkpoint``.
- ``runtime.py`` is the state an eager run shares between calls (collective logs, the pass
  running, the overlap of the backward); a compiled run reads none of it.

The program runs eagerly and under ``torch.compile``; ``runtime/executor.py`` wraps it in the
user-facing ``ParallelModule``.
"""
