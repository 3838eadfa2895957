"""Suite-wide settings: property tests draw the same examples on every run (derandomized), so a
failure in CI reproduces locally and a passing run stays passing."""

from hypothesis import settings

settings.register_profile("derandomized", derandomize=True, print_blob=True)
settings.load_profile("derandomized")
