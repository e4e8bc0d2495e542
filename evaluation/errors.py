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
    """Decorate an entry point: a HarnessError (or a method's ConfigError) prints one line and exits 2; Ctrl-C
    prints one line (what was kept, when the interrupted code says) and exits 130, as shells expect."""
    from methods.base import ConfigError
    from methods.tree import TreeError

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (HarnessError, ConfigError, TreeError) as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt as e:
            print(f"interrupted{'; ' + str(e) if str(e) else ''}", file=sys.stderr)
            sys.exit(130)

    return wrapper


def read_jsonl(path: Path, expected: str) -> Iterator[tuple[str, object]]:
    """(``file:line``, parsed object) for every non-blank line; a line that is not UTF-8 text or not JSON is
    named with ``expected``."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise HarnessError(f"cannot read {path} ({e.strerror}); expected {expected}") from None
    with f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise HarnessError(f"{where}: not UTF-8 text (a binary file?); expected {expected}") from None
            if not line.strip():
                continue
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as e:
                raise HarnessError(f"{where}: not valid JSON ({e.msg}); expected {expected}") from None


def read_json(path: Path, expected: str):
    """A whole JSON file; one that is unreadable, not UTF-8 or not JSON is named with ``expected``."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise HarnessError(f"cannot read {path} ({e.strerror}); expected {expected}") from None
    except UnicodeDecodeError:
        raise HarnessError(f"{path}: not UTF-8 text (a binary file?); expected {expected}") from None
    except json.JSONDecodeError as e:
        raise HarnessError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); expected {expected}") from None
