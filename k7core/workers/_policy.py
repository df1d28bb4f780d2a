"""What a worker does with a job, decided without I/O: yoltq's failure rules.

A consumer that returns succeeded (whatever it returned); one that raises failed, unless it
raised one of the consumer's ``already_done`` classes (success: the work was done before, as
yoltq's allow-cas-failure). A failed job goes back with a delay from the backoff and the
error recorded, up to ``max_retries`` times (0: no limit); the next failure buries it. A payload
that ``valid_payload`` rejects, or that cannot be decoded, is buried at once.

Per tube, a failure closes a gate for ``error_backoff.base`` seconds: a job that failed
before and comes up while the gate is closed goes back until it opens, without running or
counting (yoltq's rule: a downstream that fails one job is probably down for all), while
jobs that never failed still run.

Each recorded error starts with ``#N`` (its failure number), so the number of failures
survives the bounded error history.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .._errors import K7Error
from ._codec import JSON, Codec

MAX_ERROR_BYTES = 4096
"""The store's limit on one error text (``k7core.jobs``); longer tracebacks keep their end."""
_NUMBERED = re.compile(r"#(\d+) ")


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter and a cap: failure ``n`` (1, 2, ...) waits
    ``min(cap, base * factor ** (n - 1))``, then less by up to ``jitter`` of it, at random.
    yoltq's error backoff is 5 s."""

    base: float = 5.0
    factor: float = 2.0
    cap: float = 600.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if not (self.base >= 0 and self.factor >= 1 and self.cap >= self.base
                and 0 <= self.jitter <= 1):
            raise K7Error(f"{self!r} is not a valid backoff",
                          hint="use base >= 0, factor >= 1, cap >= base, 0 <= jitter <= 1")

    def delay(self, failures: int, rand: float) -> float:
        """The delay after failure number ``failures``; ``rand`` is uniform in [0, 1)."""
        raw = self.base * self.factor ** min(failures - 1, 64)
        full = min(self.cap, raw)
        return full * (1.0 - self.jitter * rand)


@dataclass(frozen=True)
class Options:
    """How one tube's jobs are put and run. Every field has yoltq's default where yoltq
    has one."""

    concurrency: int = 1
    """Jobs of the tube run at once by this worker."""
    max_retries: int = 0
    """Retries after the first run; the failure after the last retry buries the job. 0:
    retry without limit (yoltq)."""
    backoff: Backoff = Backoff()
    valid_payload: Callable[[Any], object] | None = None
    """A predicate on the decoded payload; a falsy answer buries the job at once."""
    already_done: tuple[type[BaseException], ...] = ()
    """Exceptions the consumer raises to say the work was already done: success."""
    codec: Codec = JSON
    context: tuple[ContextVar[Any], ...] = ()
    """Context variables captured at put and set around the consumer."""
    priority: int = 1024
    ttr: float = 60.0
    """The time-to-run of the jobs :meth:`Worker.put` puts. A running job is touched every
    third of its *own* ttr (whoever put it, with whatever ttr), so the time-to-run measures
    a live worker, not the job's length."""
    max_execute_time: float = 300.0
    """A job running longer is logged at ERROR with the stack running it (yoltq: 5 min)."""
    depends_on: Callable[[Any], Sequence[int | tuple[str, str]]] | None = None
    """Dependencies of a put, from its payload (yoltq's ``:depends-on`` function)."""

    def __post_init__(self) -> None:
        if type(self.concurrency) is not int or self.concurrency < 1:
            raise K7Error(f"concurrency {self.concurrency!r} is not valid",
                          hint="use an int >= 1")
        if type(self.max_retries) is not int or self.max_retries < 0:
            raise K7Error(f"max_retries {self.max_retries!r} is not valid",
                          hint="use an int >= 0 (0: retry without limit)")
        if not self.ttr >= 1 or not self.max_execute_time > 0:
            raise K7Error("ttr and max_execute_time must be positive (ttr at least 1 s)")
        if not all(isinstance(v, ContextVar) for v in self.context):
            raise K7Error("context takes contextvars.ContextVar objects")


class Delete(NamedTuple):
    """Done: delete the job."""


class Retry(NamedTuple):
    """Failed: back to ready after ``delay`` seconds, with ``error`` recorded."""

    delay: float
    error: str


class Bury(NamedTuple):
    """Given up: bury the job with ``error`` recorded."""

    error: str


class Defer(NamedTuple):
    """Not run now: back to ready after ``delay`` seconds, nothing recorded."""

    delay: float


Action = Delete | Retry | Bury | Defer


def failures(errors: Sequence[str]) -> int:
    """How many times a job failed, from its error history (newest last)."""
    if not errors:
        return 0
    m = _NUMBERED.match(errors[-1])
    return int(m.group(1)) if m else len(errors)


def error_text(number: int, exc: BaseException) -> str:
    """``#number Type: message`` and the traceback, at most MAX_ERROR_BYTES of UTF-8."""
    head = f"#{number} {''.join(traceback.format_exception_only(exc)).strip()}"
    tb = "".join(traceback.format_tb(exc.__traceback__))
    text = f"{head}\n{tb}" if tb else head
    raw = text.encode()
    if len(raw) <= MAX_ERROR_BYTES:
        return text
    head_raw = head.encode()[: MAX_ERROR_BYTES // 2]
    marker = b"\n...\n"
    tail = raw[len(raw) - (MAX_ERROR_BYTES - len(head_raw) - len(marker)):]
    return (head_raw + marker + tail).decode(errors="ignore")


@dataclass
class Gates:
    """Per tube, until when jobs that failed before wait (see the module's docstring)."""

    until: dict[str, float] = field(default_factory=dict)

    def failed(self, tube: str, now: float, options: Options) -> None:
        self.until[tube] = max(self.until.get(tube, 0.0), now + options.backoff.base)

    def wait(self, tube: str, errors: Sequence[str], now: float) -> float:
        """Seconds a job with ``errors`` must wait before it may run (0: run it)."""
        if not errors:
            return 0.0
        return max(self.until.get(tube, 0.0) - now, 0.0)


def after_failure(options: Options, errors: Sequence[str], exc: BaseException,
                  rand: float) -> Retry | Bury:
    """What to do with a job whose consumer raised ``exc``; ``errors`` is its history."""
    number = failures(errors) + 1
    text = error_text(number, exc)
    if options.max_retries and number > options.max_retries:
        return Bury(text)
    return Retry(options.backoff.delay(number, rand), text)
