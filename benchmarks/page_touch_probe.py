"""What the first write to each page of a new segment costs, by how the file was prepared.

``python benchmarks/page_touch_probe.py [--mib N] [--dir DIR]``. For a file of N MiB
(default 256, k7's segment size) prepared three ways, prints µs a 4 KiB page to prepare it
and to write one byte into each page through a shared map afterwards:

- ``fallocate``: ``posix_fallocate`` only (k7's segments: real blocks, unwritten extents);
- ``fallocate + pwrite zeros``: then 1 MiB ``pwrite``s of zeros over it;
- ``fallocate + MADV_POPULATE_WRITE``: then ``madvise(MADV_POPULATE_WRITE)`` of the map.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import tempfile
import time
from pathlib import Path

PAGE = 4096
MADV_POPULATE_WRITE = 23  # Linux 5.14


def trial(path: Path, size: int, how: str) -> tuple[float, float]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        t0 = time.perf_counter()
        os.posix_fallocate(fd, 0, size)
        if how == "pwrite":
            zeros = bytes(1 << 20)
            for off in range(0, size, len(zeros)):
                os.pwrite(fd, zeros, off)
        m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        if how == "populate":
            buf = ctypes.c_char.from_buffer(m)
            libc = ctypes.CDLL(None, use_errno=True)
            rc = libc.madvise(ctypes.c_void_p(ctypes.addressof(buf)), ctypes.c_size_t(size),
                              MADV_POPULATE_WRITE)
            del buf
            if rc:
                raise OSError(ctypes.get_errno(), "madvise(MADV_POPULATE_WRITE)")
        t1 = time.perf_counter()
        for off in range(0, size, PAGE):
            m[off] = 1
        t2 = time.perf_counter()
        m.close()
    finally:
        os.close(fd)
        path.unlink()
    pages = size // PAGE
    return (t1 - t0) / pages * 1e6, (t2 - t1) / pages * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for how, name in (("none", "fallocate"), ("pwrite", "fallocate + pwrite zeros"),
                          ("populate", "fallocate + MADV_POPULATE_WRITE")):
            prep, touch = trial(Path(tmp) / "seg", args.mib << 20, how)
            print(f"{name}: prepare {prep:.2f} us a page, first write {touch:.2f} us a page, "
                  f"together {prep + touch:.2f}", flush=True)


if __name__ == "__main__":
    main()
