"""``python -m autoshard.solve``: the solver's command line: model file or IOPDDL problem file in, proved plan out (``autoshard.cli.solve``)."""

from autoshard.cli.process import exit_now
from autoshard.cli.solve import main

if __name__ == "__main__":
    exit_now(main())
