"""Where the checkout and the shared data are."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = ROOT.parent / "shared" / "data"
GOLDEN = ROOT / "tests" / "golden"
