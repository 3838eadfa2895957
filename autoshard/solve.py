"""``python -m autoshard.solve``: the solver's command line: model file or IOPDDL problem file in, proved plan out (``autoshard.cli.solve``)."""

from autoshard.cli import memory_guard
from autoshard.cli.process import exit_now
from autoshard.cli.solve import main

if __name__ == "__main__":
    memory_guard.return_freed_blocks()
    memory_guard.start("plan on a smaller mesh or fewer layers, pin layouts with --pin to shrink the search, "
                       "or use a machine with more memory")
    exit_now(main())
