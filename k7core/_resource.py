"""The context-manager face shared by every object that owns OS resources."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Resource:
    """``with obj:`` closes ``obj`` on exit; subclasses define an idempotent ``close()``."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
