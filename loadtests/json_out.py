"""How every benchmark reports: its figures as indented JSON on stdout and, when asked,
in a file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def print_json(figures: Any, path: str | Path | None = None) -> None:
    text = json.dumps(figures, indent=2)
    print(text)
    if path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n", encoding="utf-8")
