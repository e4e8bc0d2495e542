"""The bottom of the stack: the project's paths, its one user-error type, atomic writes and careful reads.

Every other module, in ``methods/``, ``evaluation/`` and ``scripts/``, takes these from here:

* **paths**, independent of the working directory; ``HARNESS_CACHE`` moves everything downloaded,
  converted or measured (``CACHE``), ``HARNESS_SHARED`` the shared folder beside the project;
* **HarnessError**, bad input or environment: its message names the problem and the fix, and an entry point
  decorated with ``exit_on_error`` prints it as one line and exits 2;
* **atomic writes**: a file (or folder) is written beside its destination and renamed over it, so a killed
  process leaves the old version or the new one, never half of one;
* **reads** of JSON, JSON lines and tensor files that name the file, the line and what was expected.
"""
from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"  # what ships with the project: tree templates, calibrations, the embedded model's EAGLE head
# Downloaded, converted or measured artefacts (the embedded model, the question file, timings); never committed.
CACHE = Path(os.environ.get("HARNESS_CACHE", DATA / "cache"))
RESULTS = ROOT / "results"
# The shared folder beside the project root on development and CI machines.
SHARED = Path(os.environ.get("HARNESS_SHARED", ROOT.parent / "shared"))


class HarnessError(Exception):
    """Bad input or environment. The message names the problem and the fix; no traceback is shown."""


def exit_on_error(fn):
    """Decorate an entry point: a HarnessError, or a place it may not write (permission denied, a read-only file
    system), prints one line and exits 2; Ctrl-C prints one line (what was kept, when the interrupted code says)
    and exits 130, as shells expect."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except HarnessError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        except OSError as e:  # a place the user may not write: where, and the fix, not a traceback
            if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            print(f"error: cannot write {e.filename or 'a file'} ({e.strerror}); choose a writable place (--out DIR "
                  f"where the command has one) or fix its permissions", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt as e:
            print(f"interrupted{'; ' + str(e) if str(e) else ''}", file=sys.stderr)
            sys.exit(130)

    return wrapper


@contextmanager
def atomic(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write a file or a folder at; on success it replaces ``path``
    in one rename, on failure it is removed. The parent folder is made if missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)


@contextmanager
def folder_replaced(folder: Path) -> Iterator[Path]:
    """Yield a new, empty folder beside ``folder`` to fill; on success it takes ``folder``'s place whole, so that a
    reader (or a killed writer) finds the old folder or the new one, never a mix; on failure it is removed. A
    folder cannot be renamed over a non-empty one: the old one steps aside first and is removed after."""
    folder = Path(folder).absolute()
    aside = folder.with_name(f"{folder.name}.{os.getpid()}.old")
    shutil.rmtree(aside, ignore_errors=True)  # left by a process of this id killed between the two renames
    with atomic(folder) as tmp:
        tmp.mkdir()
        yield tmp
        if folder.is_dir():
            os.replace(folder, aside)
    shutil.rmtree(aside, ignore_errors=True)


def write_text_atomic(path: Path, text: str) -> None:
    with atomic(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: Path, obj, indent: int = 2) -> None:
    write_text_atomic(path, json.dumps(obj, indent=indent, default=str) + "\n")


def write_jsonl_atomic(path: Path, records, ensure_ascii: bool = True) -> None:
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=ensure_ascii) + "\n" for r in records))


def save_torch_atomic(path: Path, obj) -> None:
    """``torch.save`` that a kill cannot leave half-written."""
    import torch

    with atomic(path) as tmp:
        torch.save(obj, tmp)


def load_torch_safe(path: Path, map_location=None):
    """``torch.load`` of a file of tensors and plain containers only (``weights_only=True``, whatever
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` says): a file holding code is refused, not run."""
    import pickle

    import torch

    try:
        with open(path, "rb") as f:
            return torch.load(f, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        first = next((line for line in str(e).splitlines() if line.strip()), "")
        raise HarnessError(f"{path} holds more than tensors, so it was not loaded ({first[:120]}); delete it if "
                           f"this harness did not write it") from None
    except (RuntimeError, EOFError) as e:
        raise HarnessError(f"{path} is not a readable tensor file ({type(e).__name__}: "
                           f"{str(e).splitlines()[0][:120] if str(e) else 'truncated'}); delete it to start "
                           f"over") from None


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
