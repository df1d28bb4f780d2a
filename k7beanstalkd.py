"""``k7-beanstalkd``: beanstalkd 1.12's command line (its flags, its defaults) over a k7 job
store, so that tooling and client test suites that start ``beanstalkd`` start it unchanged.

This module imports only the standard library. It parses the flags and binds the listening
socket (as beanstalkd's ``net.c`` does), drops to ``-u USER`` like beanstalkd, and only then
loads the server (``k7async.server``, ~0.2 s of imports). A client that connects meanwhile is
queued by the kernel instead of refused: client test suites connect 0.1 s after starting
the server.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import stat
import sys
from collections.abc import Sequence

DEFAULT_PORT = 11300
"""beanstalkd's port (``k7core.beanstalk.DEFAULT_PORT`` checks that it is this one)."""

BACKLOG = 1024
"""The listen backlog, as beanstalkd's."""


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"port {text!r} is not a number in 0..65535")
    return int(text)


def parser() -> argparse.ArgumentParser:
    """beanstalkd's flags, and what each means here."""
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
    p.add_argument("-z", dest="max_job_size", type=int, default=65535, metavar="BYTES",
                   help="largest job body (default 65535)")
    p.add_argument("-s", dest="binlog_size", type=int, metavar="BYTES",
                   help="accepted and ignored (the journal's segments are fixed)")
    p.add_argument("-u", dest="user", metavar="USER",
                   help="become USER once listening (as root only)")
    p.add_argument("-c", dest="compact", action="store_true", help="accepted (no-op)")
    p.add_argument("-n", dest="no_compact", action="store_true", help="accepted (no-op)")
    p.add_argument("-V", dest="verbose", action="count", default=0, help="be verbose")
    p.add_argument("-v", dest="version", action="store_true", help="print the version")
    p.add_argument("-h", action="help", help="show this help")
    return p


def listen(address: str, port: int) -> socket.socket:
    """A listening socket for ``-l ADDRESS -p PORT`` as beanstalkd makes it: ``unix:PATH``
    replaces a socket file left there (not another file); else the first address
    ``getaddrinfo`` gives that binds. Raises OSError (ValueError for ``unix:`` without a
    path)."""
    if address.startswith("unix:"):
        path = address[5:]
        if not path:
            raise ValueError("unix: needs a path, as in unix:/run/k7.sock")
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(os.stat(path).st_mode):
                raise FileExistsError(17, "another file already exists there", path)
            os.unlink(path)  # a socket left by a server that died (as beanstalkd)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            sock.listen(BACKLOG)
        except BaseException:
            sock.close()
            raise
        return sock
    error: OSError | None = None
    for family, kind, proto, _, where in socket.getaddrinfo(
            address, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(where)
            sock.listen(BACKLOG)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        return sock
    raise error or OSError(f"{address} has no address to listen on")


def become(user: str) -> None:
    """Switch to ``user`` (its uid and gid), or exit saying why."""
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


def listen_as_asked(args: argparse.Namespace) -> socket.socket:
    """The listening socket for parsed flags (``-l``, ``-p``), then ``-u USER``; exits
    saying why when it cannot."""
    try:
        sock = listen(args.address, args.port)
    except ValueError as exc:
        sys.exit(f"k7-beanstalkd: {exc}")
    except OSError as exc:
        if exc.filename is not None:  # a Unix socket's path
            sys.exit(f"k7-beanstalkd: {exc.filename}: {exc.strerror}")
        sys.exit(f"k7-beanstalkd: cannot listen on {args.address}: {exc}")
    if args.user:
        become(args.user)
    return sock


def main(argv: Sequence[str] | None = None) -> None:
    """``k7-beanstalkd``: listen first, then load and run the server."""
    args = parser().parse_args(argv)
    sock = None if args.version else listen_as_asked(args)
    from k7async.server import main as serve_main

    serve_main(argv, sock=sock)


if __name__ == "__main__":
    main()
