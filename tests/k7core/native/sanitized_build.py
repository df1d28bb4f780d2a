"""Build k7core's two compiled modules (``_k7`` through cffi, ``_fast``) in place with extra
compiler and linker flags, for ``sanitize_python.sh``: run it from a copy of the package.

The flags (``K7_SANITIZE_FLAGS``) go after each extension's own, so ``-O1`` wins over
``setup.py``'s ``-O3``; ``CFLAGS`` would come first and lose.
"""

from __future__ import annotations

import os
import runpy
import shlex
import sys

from setuptools import Extension
from setuptools.command.build_ext import build_ext

FLAGS = shlex.split(os.environ.get("K7_SANITIZE_FLAGS", ""))
_build_extension = build_ext.build_extension


def build_extension(self: build_ext, ext: Extension) -> None:
    """Build ``ext`` with ``FLAGS`` appended to its compile and link arguments."""
    ext.extra_compile_args = [*(ext.extra_compile_args or []), *FLAGS]
    ext.extra_link_args = [*(ext.extra_link_args or []), *FLAGS]
    _build_extension(self, ext)


if __name__ == "__main__":
    if not FLAGS:
        sys.exit("set K7_SANITIZE_FLAGS")
    build_ext.build_extension = build_extension
    sys.argv = ["setup.py", "-q", "build_ext", "--inplace", "--force"]
    runpy.run_path("setup.py", run_name="__main__")
