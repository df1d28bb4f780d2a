"""The server half of ``k7-beanstalkd`` (the command line itself, its flags and the early
bind, are ``k7beanstalkd``, which imports only the standard library)."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import socket
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio

import k7beanstalkd
from k7core import K7Error
from k7core import __version__ as k7_version
from k7core.beanstalk import MAX_JOB_SIZE_LIMIT, VERSION
from k7core.jobs import MAX_BODY

from ._server import Server, ServerConfig, serve

MAX_JOB_SIZE = min(MAX_BODY, MAX_JOB_SIZE_LIMIT)
"""The largest ``-z`` / ``--max-job-size`` (beanstalkd takes up to 1 GiB; a job here is one
journal record)."""


def announce(server: Server) -> None:
    """Print a line ``listening on ADDRESS`` per address (tools wait for it)."""
    for address in server.addresses:
        print(f"listening on {address}", flush=True)


def _backend_options(backend: str) -> dict[str, object]:
    if backend == "asyncio" and importlib.util.find_spec("uvloop") is not None:
        return {"use_uvloop": True}
    return {}


def run(config: ServerConfig, backend: str = "asyncio",
        on_ready: Callable[[Server], object] = announce) -> None:
    """Run the server in this thread until SIGTERM/SIGINT (asyncio uses uvloop when it is
    installed); ``on_ready`` by default prints where it listens."""
    anyio.run(lambda: serve(config, on_ready=on_ready), backend=backend,
              backend_options=_backend_options(backend))


def check_job_size(value: int) -> int:
    if not 0 <= value <= MAX_JOB_SIZE:
        raise ValueError(f"max job size {value} is not in 0..{MAX_JOB_SIZE}")
    return value


def configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity == 0 else logging.INFO if verbosity == 1 else \
        logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def main(argv: Sequence[str] | None = None, *, sock: socket.socket | None = None) -> None:
    """``k7-beanstalkd``: beanstalkd's command line over a k7 job store. ``sock``: the
    listening socket for the flags' ``-l``/``-p``, bound already by ``k7beanstalkd.main``
    (None: bound here)."""
    args = k7beanstalkd.parser().parse_args(argv)
    if args.version:
        print(f"beanstalkd {VERSION} (k7-beanstalkd, k7 {k7_version})")
        return
    if sock is None:
        sock = k7beanstalkd.listen_as_asked(args)
    configure_logging(args.verbose)
    if args.max_job_size > MAX_JOB_SIZE:  # as beanstalkd does past its own limit
        print(f"k7-beanstalkd: maximum job size was set to {MAX_JOB_SIZE}", file=sys.stderr)
    try:
        max_job_size = check_job_size(min(args.max_job_size, MAX_JOB_SIZE))
    except ValueError as exc:
        sock.close()
        sys.exit(f"k7-beanstalkd: {exc}")
    if args.never_fsync:
        fsync, interval = "flush", 50e-6
    elif args.fsync_ms == 0:
        fsync, interval = "sync", 50e-6
    else:
        fsync, interval = "async", (50 if args.fsync_ms is None else args.fsync_ms) / 1000
    with contextlib.ExitStack() as stack:
        stack.callback(sock.close)  # (the server closes it; this covers a failed start)
        directory = args.binlog or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="k7-beanstalkd-"))
        config = ServerConfig(directory=Path(directory), listen=(), sockets=(sock,),
                              fsync=fsync, commit_interval=interval,
                              max_job_size=max_job_size)
        try:
            run(config)
        except K7Error as exc:
            sys.exit(f"k7-beanstalkd: {exc}")
        except OSError as exc:
            if exc.filename is not None:  # the job store's directory (-b)
                sys.exit(f"k7-beanstalkd: {exc.filename}: {exc.strerror}")
            sys.exit(f"k7-beanstalkd: {exc}")
