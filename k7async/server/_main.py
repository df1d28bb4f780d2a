"""``k7-beanstalkd``: beanstalkd's command line (its flags, its defaults) over a k7 job
store, so that tooling and client test suites that start ``beanstalkd`` start it unchanged.
Needs nothing beyond k7's own dependencies."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio

from k7core import K7Error
from k7core import __version__ as k7_version
from k7core.beanstalk import DEFAULT_MAX_JOB_SIZE, DEFAULT_PORT, MAX_JOB_SIZE_LIMIT, VERSION
from k7core.jobs import MAX_BODY

from ._server import Listen, Server, ServerConfig, serve

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


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"port {text!r} is not a number in 0..65535")
    return int(text)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="k7-beanstalkd", add_help=False,
        description="beanstalkd 1.12 over a k7 job store (a drop-in: beanstalkd's flags).")
    p.add_argument("-b", dest="binlog", metavar="DIR",
                   help="the job store's directory (default: a temporary one, removed at "
                   "exit, like beanstalkd without a binlog)")
    p.add_argument("-f", dest="fsync_ms", type=int, metavar="MS",
                   help="msync at most every MS milliseconds (0: before each reply, with "
                   "group commit); default 50, as beanstalkd")
    p.add_argument("-F", dest="never_fsync", action="store_true",
                   help="never msync (each reply waits for the job to be written only)")
    p.add_argument("-l", dest="address", default="0.0.0.0", metavar="ADDR",
                   help="listen on ADDR (or unix:PATH); default 0.0.0.0")
    p.add_argument("-p", dest="port", type=_port, default=DEFAULT_PORT, metavar="PORT",
                   help=f"listen on PORT (default {DEFAULT_PORT}; 0: any free port)")
    p.add_argument("-z", dest="max_job_size", type=int, default=DEFAULT_MAX_JOB_SIZE,
                   metavar="BYTES", help=f"largest job body (default {DEFAULT_MAX_JOB_SIZE})")
    p.add_argument("-s", dest="binlog_size", type=int, metavar="BYTES",
                   help="accepted and ignored (the journal's segments are fixed)")
    p.add_argument("-u", dest="user", metavar="USER", help="become USER (as root only)")
    p.add_argument("-c", dest="compact", action="store_true", help="accepted (no-op)")
    p.add_argument("-n", dest="no_compact", action="store_true", help="accepted (no-op)")
    p.add_argument("-V", dest="verbose", action="count", default=0, help="be verbose")
    p.add_argument("-v", dest="version", action="store_true", help="print the version")
    p.add_argument("-h", action="help", help="show this help")
    return p


def _become(user: str) -> None:
    import os
    import pwd

    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        sys.exit(f"k7-beanstalkd: no such user: {user}")
    if os.getuid() != entry.pw_uid:
        try:
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
        except OSError as exc:
            sys.exit(f"k7-beanstalkd: cannot become {user}: {exc.strerror}")


def main(argv: Sequence[str] | None = None) -> None:
    """``k7-beanstalkd``: beanstalkd's command line over a k7 job store."""
    args = _parser().parse_args(argv)
    if args.version:
        print(f"beanstalkd {VERSION} (k7-beanstalkd, k7 {k7_version})")
        return
    configure_logging(args.verbose)
    try:
        address = Listen.parse(args.address, default_port=args.port)
        if not args.address.startswith("unix:") and args.address.count(":") != 1:
            address = Listen(host=address.host, port=args.port)
        if args.max_job_size > MAX_JOB_SIZE:  # as beanstalkd does past its own limit
            print(f"k7-beanstalkd: maximum job size was set to {MAX_JOB_SIZE}",
                  file=sys.stderr)
        max_job_size = check_job_size(min(args.max_job_size, MAX_JOB_SIZE))
    except ValueError as exc:
        sys.exit(f"k7-beanstalkd: {exc}")
    if args.never_fsync:
        fsync, interval = "flush", 50e-6
    elif args.fsync_ms == 0:
        fsync, interval = "sync", 50e-6
    else:
        fsync, interval = "async", (50 if args.fsync_ms is None else args.fsync_ms) / 1000
    if args.user:
        _become(args.user)
    with contextlib.ExitStack() as stack:
        directory = args.binlog or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="k7-beanstalkd-"))
        config = ServerConfig(directory=Path(directory), listen=(address,), fsync=fsync,
                              commit_interval=interval, max_job_size=max_job_size)
        try:
            run(config)
        except K7Error as exc:
            sys.exit(f"k7-beanstalkd: {exc}")
        except OSError as exc:
            if exc.filename is not None:  # the job store's directory (-b), a socket's path
                sys.exit(f"k7-beanstalkd: {exc.filename}: {exc.strerror}")
            sys.exit(f"k7-beanstalkd: cannot listen on {args.address}: {exc}")
