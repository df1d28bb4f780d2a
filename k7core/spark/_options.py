"""Reading the data source's options: Spark passes strings, under case-insensitive names."""

from __future__ import annotations

import os
from typing import Any

from ._errors import K7OptionError


def lower(options: Any) -> dict[str, str]:
    """Spark's option names are case-insensitive: look them up in lower case."""
    return {str(k).lower(): str(v) for k, v in dict(options).items()}


def queue_path(options: dict[str, str], who: str, call: str) -> str:
    """The absolute queue directory of the ``path`` option (``call``: how a user sets it)."""
    path = options.get("path")
    if not path:
        raise K7OptionError(f"the k7 {who} needs a path: {call}(path) or option('path', ...)")
    return os.path.abspath(path)


def flag(options: dict[str, str], key: str, default: bool = False) -> bool:
    """A ``true`` / ``false`` option."""
    raw = str(options.get(key.lower(), "true" if default else "false")).strip().lower()
    if raw not in ("true", "false"):
        raise K7OptionError(f"option {key} must be true or false, not {raw!r}")
    return raw == "true"


def int_option(options: dict[str, str], key: str, default: int, minimum: int) -> int:
    """An integer option, at least ``minimum``; ``default`` when it is not set."""
    raw = options.get(key.lower())
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise K7OptionError(f"option {key} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise K7OptionError(f"option {key} must be >= {minimum}, not {value}")
    return value


def seconds_option(options: dict[str, str], key: str, default: float) -> float:
    """A number of seconds."""
    try:
        return float(options.get(key.lower(), default))
    except ValueError:
        raise K7OptionError(f"option {key} must be seconds (a number)") from None


def offset_option(options: dict[str, str], key: str, default: str) -> str | int:
    """``earliest``, ``latest`` or a non-negative offset."""
    raw = options.get(key.lower(), default).strip()
    if raw in ("earliest", "latest"):
        return raw
    try:
        value = int(raw)
    except ValueError:
        raise K7OptionError(
            f"option {key} must be 'earliest', 'latest' or a non-negative offset, not {raw!r}"
        ) from None
    if value < 0:
        raise K7OptionError(f"option {key} must be >= 0, not {value}")
    return value
