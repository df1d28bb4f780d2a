"""cffi build script for the k7 kernel (API mode, out-of-line)."""

from __future__ import annotations

import re
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).parent


def _cdef() -> str:
    text = (HERE / "k7.h").read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    lines = []
    for ln in text.splitlines():
        if ln.startswith("#include"):
            continue
        m = re.match(r"#define (\w+) ", ln)
        lines.append(f"#define {m.group(1)} ..." if m else ln)
    return "\n".join(lines)


ffibuilder = FFI()
ffibuilder.cdef(_cdef())
ffibuilder.set_source(
    "k7core._native._k7",
    '#include "k7.h"',
    sources=[str(Path("k7core/_native/k7.c")), str(Path("k7core/_native/k7_bus.c"))],
    include_dirs=[str(Path("k7core/_native"))],
    libraries=["pthread"],
    extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-fno-strict-aliasing"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
