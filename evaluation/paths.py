"""Where the project keeps things. Independent of the working directory."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Downloaded or converted artefacts (the embedded model, the question file); never committed.
CACHE = Path(os.environ.get("HARNESS_CACHE", ROOT / "data" / "cache"))
RESULTS = ROOT / "results"
# The shared folder beside the project root on development and CI machines.
SHARED = Path(os.environ.get("HARNESS_SHARED", ROOT.parent / "shared"))
