"""Bulk reads without a Python object per message: ``Queue.read_columnar`` and its batch."""

from __future__ import annotations

import array

from ._checks import check_count, check_int
from ._format import MAX_OFFSET
from ._kernel import ffi, lib
from ._log import LogView
from ._reader import Reader

_from_buffer = ffi.from_buffer
_ZERO = array.array("q", [0])


class ColumnarBatch:
    """A batch read without per-message objects: ``payload i`` is
    ``view[starts[i]:starts[i] + lengths[i]]``; ``next`` is the offset after the batch."""

    __slots__ = ("lengths", "next", "offsets", "starts", "view")

    def __init__(
        self,
        offsets: array.array[int],
        starts: array.array[int],
        lengths: array.array[int],
        view: memoryview,
        next_offset: int,
    ) -> None:
        self.offsets = offsets
        self.starts = starts
        self.lengths = lengths
        self.view = view
        self.next = next_offset

    def __len__(self) -> int:
        return len(self.offsets)

    def payload(self, i: int) -> memoryview:
        s = self.starts[i]
        return self.view[s : s + self.lengths[i]]

    def gather(self) -> tuple[bytes, array.array[int]]:
        """Copy the payloads into one contiguous buffer with int32 Arrow-style offsets."""
        n = len(self.offsets)
        total = sum(self.lengths)
        dst = bytearray(total)
        offs = array.array("i", bytes(4 * (n + 1)))
        if n:
            src = ffi.from_buffer(self.view)
            rc = lib.k7_gather(
                src, len(src),
                ffi.cast("int64_t *", ffi.from_buffer(self.starts)),
                ffi.cast("int64_t *", ffi.from_buffer(self.lengths)),
                n, ffi.from_buffer(dst), total,
                ffi.cast("int32_t *", ffi.from_buffer(offs)),
            )
            if rc < 0:
                raise ValueError("batch too large to gather into int32 offsets")
        return bytes(dst), offs


class BulkReader:
    """``read_columnar`` for one log. Its readers are kept across calls (mapping a segment
    costs more than a scan); a call takes one for itself, so calls from several threads
    never share one."""

    def __init__(self, log: LogView) -> None:
        self._log = log
        self._idle: list[Reader] = []
        self._closed = False

    def read(self, offset: int, max_messages: int) -> ColumnarBatch:
        offset = check_int(offset, "offset", 0, MAX_OFFSET)
        max_messages = check_count(max_messages, "max_messages")
        starts = _ZERO * max_messages
        lens = _ZERO * max_messages
        try:
            reader = self._idle.pop()  # atomic: each reader has one user at a time
        except IndexError:
            reader = Reader(self._log, 1)
        try:
            batch = _read(reader, offset, max_messages, starts, lens)
        except BaseException:
            reader.close()
            raise
        if self._closed:
            reader.close()
        else:
            self._idle.append(reader)
        return batch

    def close(self) -> None:
        """Release the kept readers' maps. Idempotent."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()


def _read(
    reader: Reader, offset: int, max_messages: int,
    starts: array.array[int], lens: array.array[int],
) -> ColumnarBatch:
    c = reader.c
    with _from_buffer(starts) as sbuf, _from_buffer(lens) as lbuf:
        try:
            c.starts, c.lens = ffi.cast("int64_t *", sbuf), ffi.cast("int64_t *", lbuf)
            c.capacity = max_messages
            c.pos = offset
            n = reader.read(max_messages)
            view = reader.view[:] if n and reader.view is not None else memoryview(b"")
            offsets = _ZERO * n
            if n:
                lib.k7_add_const(ffi.cast("int64_t *", _from_buffer(offsets)),
                                 c.starts, n, reader.base10)
            next_offset = int(c.pos)
        finally:
            c.starts = c.lens = ffi.NULL
            c.capacity = 0
    del starts[n:]
    del lens[n:]
    return ColumnarBatch(offsets, starts, lens, view, next_offset)
