"""Errors every command shares (a leaf: imports nothing from jitserve).

:class:`CLIError` is a user error on the command line or in a file it names: the CLI
prints it as one line and exits 2, never a traceback. It lives here, not in
``jitserve.cli``, so that ``python -m jitserve.cli`` and the console script raise and catch
the very same class.
"""

from __future__ import annotations


class CLIError(Exception):
    """A user error: printed as one line, exit code 2."""
