"""What the engines and the config builder read from an HF checkpoint folder without loading it."""

from __future__ import annotations

import json
from pathlib import Path


def max_position_embeddings(model_dir: str | Path) -> int | None:
    """``max_position_embeddings`` of ``model_dir/config.json``; None when absent or not an int."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return None
    value = json.loads(path.read_text()).get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None
