"""Draft heads: what the head methods (EAGLE, EAGLE-2, EAGLE-3, Medusa, Hydra) draft with, kept apart from the
proposers that use them so that training a head (``scripts/train_*.py``) never loads a method.

One module per head family (the module, its published checkpoint layout, a random head, its training), the
fitting loop they share (``fit``), EAGLE's training data and loop (``eagle_train``), and below, the three steps
every head method takes the same way.
"""
from __future__ import annotations

from collections.abc import Callable

from methods.common import HarnessError
from methods.engine.ops import Linear, can_pack


def require_head(method: str, head: str | None, *, what: str, layout: str, trainer: str) -> None:
    """A head named in ``method.head``; none (a model config without one) is the one error that says how to get
    one. A head method's ``check``: said from the config, before the target loads."""
    if not head:
        raise HarnessError(f"method '{method}' needs {what} and the model config names none: give method.head=PATH "
                           f"(a folder in {layout}'s layout, or a hub id), train one with python -m {trainer}, or "
                           f"method.head=random (lossless, slow)")


def head_or_random(method: str, head: str | None, *, what: str, layout: str, trainer: str, load: Callable,
                   random: Callable):
    """The head ``method.head`` names (``require_head``): ``load(head)`` for a folder or hub id, ``random()`` for
    ``random``."""
    require_head(method, head, what=what, layout=layout, trainer=trainer)
    return random() if head == "random" else load(head)


def target_lm_head(target, device) -> Linear:
    """The target's lm_head for a head's features (oneDNN-packed on a CPU where it can be; ``match_engine``)."""
    return Linear(target.get_output_embeddings(), can_pack(device, next(target.parameters()).dtype))


def match_engine(lm_head: Linear | None, preparation) -> None:
    """Run a head method's lm_head as the target's engine runs its own: where ``engine.pack=auto`` measured plain
    weights faster on this machine (or ``engine.pack=false``, or ``engine.compile``), not packed either."""
    if lm_head is not None and getattr(preparation.engine, "pack", None) is False:
        lm_head.unpack()
