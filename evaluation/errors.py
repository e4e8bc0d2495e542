"""One kind of user-facing error, and one way to report it."""
from __future__ import annotations

import functools
import sys


class HarnessError(Exception):
    """Bad input or environment. The message names the problem and the fix; no traceback is shown."""


def exit_on_error(fn):
    """Decorate an entry point: a HarnessError (or a method's ConfigError) prints one line and exits 2."""
    from methods.base import ConfigError
    from methods.tree import TreeError

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (HarnessError, ConfigError, TreeError) as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)

    return wrapper
