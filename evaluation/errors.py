"""One kind of user-facing error, and one way to report it."""
from __future__ import annotations

import functools
import json
import sys
from collections.abc import Iterator
from pathlib import Path


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


def read_jsonl(path: Path, expected: str) -> Iterator[tuple[str, object]]:
    """(``file:line``, parsed object) for every non-blank line; invalid JSON names the line and ``expected``."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as e:
                raise HarnessError(f"{where}: not valid JSON ({e.msg}); expected {expected}") from None
