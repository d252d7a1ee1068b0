"""Safe parsing of ``name=value`` text (CLI, magics): numbers, booleans, strings. Never eval.

Runs in: client processes.
"""

from __future__ import annotations

import math
from typing import Any

from ..protocol.errors import InvalidHParam


def parse_value(text: str) -> Any:
    t = text.strip()
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(t)
    except ValueError:
        pass
    try:
        v = float(t)
    except ValueError:
        return t[1:-1] if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"" else t
    # "nan"/"inf" parse as floats; sending them on lets the job reject them by name.
    return v if math.isfinite(v) or low in ("nan", "inf", "-inf", "+inf") else t


def parse_assignments(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise InvalidHParam(f"expected name=value, got {item!r}")
        out[name.strip()] = parse_value(value)
    return out
