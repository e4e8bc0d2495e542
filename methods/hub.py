"""Where a checkpoint comes from: one rule for target models (``model.checkpoint``) and draft heads (``method.head``).

A name that exists on disk (as given, or relative to the project root) is a local folder; any other name
of the form ``owner/name`` is a Hugging Face hub id, read from the hub's local cache and downloaded when
the hub can be reached. The rule asks the disk, not the spelling: ``yuhuili/EAGLE-Vicuna-7B-v1.3`` ends in
``.3`` and is still a hub id.

>>> locate("yuhuili/EAGLE-Vicuna-7B-v1.3", "method.head")
'yuhuili/EAGLE-Vicuna-7B-v1.3'
>>> locate("data/trees", "method.head") == ROOT / "data/trees"  # relative to the project, wherever it runs
True
"""
from __future__ import annotations

import json
import re
import socket
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlparse

from methods.common import ROOT, HarnessError

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def locate(ref: str, setting: str) -> Path | str:
    """A folder on disk (a ``Path``) or a hub id (a ``str``); neither: a ``HarnessError`` naming ``setting``."""
    path = Path(ref).expanduser()
    for candidate in (path,) if path.is_absolute() else (path, ROOT / path):
        if candidate.exists():
            return candidate.absolute()
    if HUB_ID.fullmatch(ref):
        return ref
    raise HarnessError(f"{setting}={ref}: no such folder here, and not a hub id (owner/name); set {setting}=PATH "
                      f"to a folder with config.json")


@lru_cache(maxsize=1)
def offline() -> bool:
    """True when the hub cannot be asked: ``HF_HUB_OFFLINE`` is set, or its host does not resolve (no
    network). Then only the local cache is read, without huggingface_hub's minute of retries."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return True
    try:
        socket.getaddrinfo(urlparse(constants.ENDPOINT).hostname, 443)
    except OSError:
        return True
    return False


def in_cache(repo: str) -> bool:
    """The hub's local cache holds ``repo`` (its config.json)."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo, "config.json"), str)


def not_cached(repo: str, setting: str) -> HarnessError:
    why = ("no network here: run `hf download " + repo + "` where there is one and bring the folder (or the hub "
           "cache, HF_HUB_CACHE)") if offline() else "the hub could not send it: check the name and the network"
    return HarnessError(f"the checkpoint is not in the local cache: download {repo} or set {setting}=PATH ({why})")


def gated(repo: str, setting: str) -> HarnessError:
    return HarnessError(f"the hub refused {repo}: it is gated; accept its licence on huggingface.co and log in "
                       f"(`hf auth login`), or set {setting}=PATH to a local copy")


def download(repo: str, setting: str, patterns: list[str]) -> Path:
    """The local snapshot of the files of hub ``repo`` matching ``patterns`` (fetched if the hub is reachable)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError

    try:
        return Path(snapshot_download(repo, allow_patterns=patterns, local_files_only=offline()))
    except GatedRepoError:
        raise gated(repo, setting) from None
    except Exception:  # offline and not cached, no such repository, a broken connection, ...
        raise not_cached(repo, setting) from None


def folder(ref: str, setting: str, patterns: list[str], holds: str) -> Path:
    """The local folder ``ref`` names (``locate``): on disk, or the hub's snapshot of the files matching
    ``patterns`` (fetched if the hub is reachable); a file instead of a folder is refused, saying what the folder
    must hold (``holds``)."""
    where = locate(ref, setting)
    if isinstance(where, str):
        return download(where, setting, patterns)
    if not where.is_dir():
        raise HarnessError(f"{setting}={ref} is a file; give the folder holding its {holds}")
    return where


def head_files(ref: str, kind: str, files: list[str]) -> tuple[Path, dict]:
    """A draft head's folder (``folder`` of ``method.head=ref``) that must hold every one of ``files``, the first
    being its config.json: (the folder, that config). A missing file is refused naming it and the ``kind`` of
    head (Medusa, Hydra) whose layout it is not."""
    where = folder(ref, "method.head", files, " and ".join(files))
    for f in files:
        if not (where / f).is_file():
            raise HarnessError(f"{kind} head {where} has no {f}: not a checkpoint in {kind}'s layout")
    return where, json.loads((where / files[0]).read_text())
