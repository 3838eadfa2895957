"""The command lines: ``solve`` (model or IOPDDL problem files), ``run`` and ``train`` under
torchrun, the rendering of solver events and plans (report.py, problem_file.py) and how a
command-line process ends (process.py). ``python -m autoshard.solve|run|train`` are thin entry
points into these modules."""
