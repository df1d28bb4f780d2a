"""Checks of the numbers callers pass (options, counts, timeouts): one message per mistake.

A wrong type is a ``TypeError``, a wrong value a ``ValueError``; ``True`` and ``False`` are
not numbers here, nor is ``nan``.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Any

MAX_BATCH = 1 << 20
"""The most messages one ``poll`` or ``read_columnar`` call may ask for."""


def check_int(value: object, name: str, minimum: int, maximum: int | None = None) -> int:
    """``value`` if it is an int in [minimum, maximum] (``__index__`` types too, not bool)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not a bool ({value!r})")
    try:
        n = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an int, not {type(value).__name__}") from None
    if n < minimum or (maximum is not None and n > maximum):
        bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {bounds}, not {n}")
    return n


def check_count(value: object, name: str) -> int:
    """A number of messages to read at once: 1 .. ``MAX_BATCH``."""
    return check_int(value, name, 1, MAX_BATCH)


def check_seconds(
    value: object, name: str, maximum: float = math.inf, *, positive: bool = False
) -> float:
    """``value`` as float seconds: a real number >= 0 (> 0 if ``positive``), <= maximum."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    low = seconds > 0 if positive else seconds >= 0
    if not (low and seconds <= maximum):  # nan fails both
        low_text = "> 0" if positive else ">= 0"
        bounds = low_text if maximum == math.inf else f"{low_text} and <= {maximum:g}"
        raise ValueError(f"{name} must be seconds {bounds}, not {value!r}")
    return seconds


def check_timeout(timeout: object) -> float:
    """A wait's ``timeout``: seconds >= 0; ``None`` (or ``math.inf``) waits until it is
    woken. Returns float seconds, ``math.inf`` for None."""
    return math.inf if timeout is None else check_seconds(timeout, "timeout")


def message_list(items: object) -> list[Any]:
    """The messages of ``enqueue_many(items)`` as a list. One bytes-like object or str is
    refused: iterating it would give ints or characters, not messages."""
    what = "enqueue_many needs an iterable of bytes-like messages"
    if isinstance(items, (bytes, bytearray, memoryview, str)):
        raise TypeError(
            f"{what}, not one {type(items).__name__} object: enqueue(data) appends one "
            "message, enqueue_many([data]) a batch of one"
        )
    try:
        it = iter(items)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"{what}, not {type(items).__name__}") from None
    return list(it)
