"""Child processes: the one place the solver forks, and the pipes and prints around it.

Contract: run a callable in a forked child killed at a wall-clock deadline (forks.py, and
call_server.py for many calls in one child), silence the C stdout of HiGHS and toulbar2
(silence.py), and carry an engine child's typed events to its parent (engine_events.py). Knows
nothing of problems or cores: imports nothing else of the solver, and nothing outside this
subpackage calls ``os.fork``.
"""
