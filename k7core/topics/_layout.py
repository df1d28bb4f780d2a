"""A topic's directory: the names of its files and its metadata (the one owner of both).

    <topic>/k7py-topic.json          {"k7py": "topic", "version": 1, "partitions": N,
                                      "partitioner": "kafka"}
    <topic>/k7py-topic.lock          flock taken while the metadata is created
    <topic>/partition-<i>/           a k7 queue per partition, i = 0 .. N-1
    <topic>/k7py-groups/<group>/     a consumer group's members and assignment
                                     (see _membership)
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .._format import queue_file
from .._stats import list_segment_infos
from .._storage import FILE_MODE, open_fd, read_file, storage_error, write_file_atomic
from ._errors import TopicDeletedError, TopicError
from ._lockfile import LOCK_TIMEOUT, holding
from ._partitioner import PARTITIONERS

META_FILE = "k7py-topic.json"
META_LOCK = "k7py-topic.lock"
GROUPS_DIR = "k7py-groups"
PARTITION_PREFIX = "partition-"
MAX_PARTITIONS = 4096
VERSION = 1


def partition_dir(topic: Path, partition: int) -> Path:
    return topic / f"{PARTITION_PREFIX}{partition}"


def groups_dir(topic: Path) -> Path:
    return topic / GROUPS_DIR


@dataclass(frozen=True)
class TopicMeta:
    """What a topic was created with; fixed for its life."""

    partitions: int
    partitioner: str
    segment_size: int | None = None  # the partitions' default; None: not recorded

    def to_json(self) -> bytes:
        doc: dict[str, object] = {
            "k7py": "topic", "version": VERSION, "partitions": self.partitions,
            "partitioner": self.partitioner,
        }
        if self.segment_size is not None:
            doc["segment_size"] = self.segment_size
        return json.dumps(doc).encode() + b"\n"

    @classmethod
    def parse(cls, data: bytes, path: Path) -> TopicMeta:
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("k7py") != "topic":
                raise ValueError("not a topic's metadata")
            if doc.get("version") != VERSION:
                raise ValueError(f"version {doc.get('version')!r}, this k7py reads {VERSION}")
            n, name = doc["partitions"], doc["partitioner"]
            if type(n) is not int or not 1 <= n <= MAX_PARTITIONS or name not in PARTITIONERS:
                raise ValueError("bad partitions or partitioner")
            size = doc.get("segment_size")
            if size is not None and (type(size) is not int or size <= 0):
                raise ValueError("bad segment_size")
        except (ValueError, KeyError, TypeError) as exc:
            raise TopicError(
                f"{path} is not a valid topic metadata file: {exc}", path=path,
                hint="restore it, or open the partitions as plain queues",
            ) from None
        return cls(n, name, size)


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """``write_file_atomic``, its OSErrors (a full disk) as StorageError with a hint."""
    try:
        write_file_atomic(path, data, mode)
    except OSError as exc:
        raise storage_error(exc, path, "write") from exc


def make_dirs(path: Path, what: str) -> None:
    """Create ``path`` and its parents; an OSError as StorageError with a hint."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a parent that is a file, no permission, a full disk
        raise storage_error(exc, path, f"create {what}") from exc


def newest_segment_size(topic: Path, default: int) -> int:
    """A topic recorded without its segment size: its partitions' newest segment's."""
    for p in range(MAX_PARTITIONS):
        d = partition_dir(topic, p)
        if not d.is_dir():
            break
        infos = list_segment_infos(d)
        if infos:
            return infos[-1].size
    return default


class DirWatch:
    """Notices that a directory written into was deleted: one fstat of a descriptor kept on
    it (a deleted directory has no links). The writer calls :meth:`check` before a write
    once ``time.monotonic()`` reaches ``due``: before every write when ``interval`` is 0
    (each write durable at once), else at most once per ``interval`` seconds, the window
    in which an ``"async"`` write is not durable yet anyway."""

    def __init__(self, path: Path, interval: float, what: str) -> None:
        self.path = path
        self.interval = interval
        self.what = what
        self.due = 0.0
        self._fd = open_fd(path, os.O_RDONLY | os.O_DIRECTORY)

    def check(self) -> None:
        """TopicDeletedError if the directory was deleted (nothing written yet)."""
        if os.fstat(self._fd).st_nlink == 0:
            lost = (f"; records written in the {self.interval:g} s before this check went "
                    "with it" if self.interval else "")
            raise TopicDeletedError(
                f"{self.what} was deleted while open: nothing was written{lost}",
                path=self.path, hint="close it, then open (or create) it again",
            )
        if self.interval:
            self.due = time.monotonic() + self.interval

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def check_partitions(partitions: object) -> int | None:
    if partitions is None:
        return None
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise TypeError(f"partitions must be an int, not {type(partitions).__name__}")
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ValueError(f"partitions must be 1 .. {MAX_PARTITIONS}, not {partitions}")
    return partitions


def open_meta(
    topic: Path, partitions: int | None, partitioner: str | None, *, create: bool,
    file_mode: int = FILE_MODE, segment_size: int | None = None,
) -> TopicMeta:
    """Read the topic's metadata, creating the topic if ``create`` and it does not exist
    (``partitions`` required then). Arguments that differ from the stored ones raise."""
    meta_path = topic / META_FILE
    if not meta_path.exists():
        if not create:
            raise TopicError(f"{topic} is not a topic (no {META_FILE})", path=topic)
        if partitions is None:
            raise TopicError(
                f"topic {topic} does not exist", path=topic,
                hint="pass partitions=N to create it",
            )
        if topic.exists() and not topic.is_dir():
            raise TopicError(f"{topic} is not a directory", path=topic)
        if topic.is_dir() and any(queue_file(n) for n in os.listdir(topic)):
            raise TopicError(
                f"{topic} is a queue, not a topic", path=topic,
                hint="a topic needs a directory of its own (its partitions are queues in it)",
            )
        make_dirs(topic, "topic directory")
        # two creators agree on one file
        with holding(topic / META_LOCK, file_mode, LOCK_TIMEOUT, "the topic's metadata lock"):
            if not meta_path.exists():
                meta = TopicMeta(partitions, partitioner or "kafka", segment_size)
                write_atomic(meta_path, meta.to_json(), file_mode)
    meta = TopicMeta.parse(read_file(meta_path), meta_path)
    if partitions is not None and partitions != meta.partitions:
        raise TopicError(
            f"topic {topic} has {meta.partitions} partitions, not {partitions}", path=topic,
            hint="open it with partitions=None (or its own count); a topic's partition count "
            "is fixed when it is created, so that keys keep their partition",
        )
    if partitioner is not None and partitioner != meta.partitioner:
        raise TopicError(
            f"topic {topic} places keys with {meta.partitioner!r}, not {partitioner!r}",
            path=topic, hint="open it with partitioner=None or its own partitioner",
        )
    return meta
