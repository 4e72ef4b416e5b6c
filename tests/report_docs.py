"""Result documents the report tests read: the JSON files under ``tests/fixtures``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIX = Path(__file__).parent / "fixtures"


def load(name: str) -> dict[str, Any]:
    return json.loads((FIX / f"{name}.json").read_text())
