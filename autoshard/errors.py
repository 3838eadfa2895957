"""User-facing errors: one line that names the problem and the fix, never a traceback."""


class AutoshardError(Exception):
    """A problem with the user's input (model, mesh, problem file, plan, budget) and how to fix it.

    The CLI prints ``str(error)`` as a single line and exits with status 2.
    """
