"""The problem and what is said about it: plain data, no search.

Contract: ``ShardingProblem`` (problem.py; the IOPDDL model, read and written by iopddl.py), the
options and answer of ``solve`` (solution.py) and the events a run emits (events.py). Imports
nothing else of the solver; every other subpackage may import it.
"""
