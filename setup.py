"""Which packages the distribution holds, the one thing pyproject.toml cannot say here: every
``autoshard*`` package of the checkout, plus ``autoshard.specs`` built from the top-level specs/
folder (setuptools' ``find`` cannot map a folder outside autoshard/ into it). Everything else is in
pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["autoshard*"]), "autoshard.specs"],
    package_dir={"autoshard.specs": "specs"},
    package_data={"autoshard.specs": ["*.toml", "*.json", "README.md"]},
)
