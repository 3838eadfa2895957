"""``python -m autoshard.train``: train a model with a plan under torchrun (``autoshard.cli.train``)."""

from autoshard.cli.process import exit_now
from autoshard.cli.train import main

if __name__ == "__main__":
    exit_now(main())
