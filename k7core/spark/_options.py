"""Reading the data source's options: Spark passes strings, under case-insensitive names."""

from __future__ import annotations

import json
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


EARLIEST = -2
"""In a topic's offsets JSON, as in Kafka's: the partition's earliest offset."""
LATEST = -1
"""In a topic's offsets JSON, as in Kafka's: the partition's end."""


def topic_offsets_option(
    options: dict[str, str], key: str, default: str, topic: str, partitions: int
) -> list[int]:
    """Kafka's ``startingOffsets`` / ``endingOffsets`` for one topic, per partition:
    ``earliest``, ``latest`` or JSON ``{"<topic>": {"0": 23, "1": -2}}`` (-2 earliest, -1
    latest). A partition the JSON leaves out takes ``default``. Returns an offset (>= 0),
    ``EARLIEST`` or ``LATEST`` for each partition; ``endingOffsets`` refuses earliest."""
    raw = options.get(key.lower(), default).strip()
    ending = key.lower() == "endingoffsets"
    example = f'{{"{topic}": {{"0": 23, "1": -2}}}}'
    if raw in ("earliest", "latest"):
        if ending and raw == "earliest":
            raise K7OptionError(f"option {key} cannot be 'earliest'")
        return [EARLIEST if raw == "earliest" else LATEST] * partitions
    try:
        doc = json.loads(raw)
    except ValueError:
        raise K7OptionError(
            f"option {key} must be 'earliest', 'latest' or JSON such as {example}, "
            f"not {raw!r}"
        ) from None
    if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
        raise K7OptionError(
            f"option {key} must be a JSON object of topics, each an object of partition "
            f"offsets, such as {example}; not {raw!r}"
        )
    others = sorted(str(name) for name in doc if name != topic)
    if others:
        raise K7OptionError(
            f"option {key} names topic {others[0]!r}; this topic is {topic!r} (the name of "
            f"its directory)"
        )
    out = topic_offsets_option({}, key, default, topic, partitions)
    for name, value in doc.get(topic, {}).items():
        try:
            p = int(name)
        except ValueError:
            p = -1
        if not 0 <= p < partitions or name != str(p):
            raise K7OptionError(
                f"option {key}: topic {topic!r} has partitions 0 .. {partitions - 1}; "
                f"there is no partition {name!r}"
            )
        low = LATEST if ending else EARLIEST
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            allowed = "-1 (latest)" if ending else "-2 (earliest), -1 (latest)"
            raise K7OptionError(
                f"option {key}: the offset of partition {p} must be >= 0, or {allowed}; "
                f"not {value!r}"
            )
        out[p] = value
    return out


def topic_offset(offset: int, earliest: int, latest: int) -> int:
    """One partition's value of a topic offsets option as an offset of its log."""
    return earliest if offset == EARLIEST else latest if offset == LATEST else offset
