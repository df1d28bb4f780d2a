"""The errors the k7 data source adds to the k7core tree."""

from __future__ import annotations

from .._errors import DataLossError, K7Error


class K7OptionError(K7Error, ValueError):
    """A data source option is missing or malformed."""


class K7DataLossError(DataLossError):
    """Offsets a query still had to read are gone: their segment was deleted, or the queue
    now ends before them (a streaming query with ``failOnDataLoss=false`` skips them). A
    :class:`k7core.DataLossError`, with ``earliest`` the first offset still in the log."""
