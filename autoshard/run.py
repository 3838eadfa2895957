"""``python -m autoshard.run``: run a plan once under torchrun and check it against the unsharded model (``autoshard.cli.run``)."""

from autoshard.cli.process import exit_now
from autoshard.cli.run import main

if __name__ == "__main__":
    exit_now(main())
