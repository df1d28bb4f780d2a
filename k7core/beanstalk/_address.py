"""Server addresses, as both clients take them: one parser."""

from __future__ import annotations

from typing import NamedTuple

from ._errors import InvalidAddressError
from .protocol import DEFAULT_PORT

_FORMS = ("beanstalk://HOST[:PORT] (port 11300 by default), HOST:PORT, [IPv6]:PORT, "
          "unix:/PATH or unix:///PATH")


class Address(NamedTuple):
    """Where a server listens: ``host`` and ``port`` over TCP, or ``path``, a Unix socket's
    (then ``host`` is ``""`` and ``port`` 0). ``str()`` gives it in a form
    :func:`parse_address` reads back."""

    host: str = ""
    port: int = 0
    path: str = ""

    def __str__(self) -> str:
        if self.path:
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_address(address: str | tuple[str, int] | Address) -> Address:
    """Read a server's address: ``beanstalk://HOST[:PORT]`` (port 11300 when left out),
    ``HOST:PORT``, ``[::1]:11300`` (IPv6 in brackets, in both forms), ``unix:/PATH``,
    ``unix:///PATH`` (a relative ``unix:PATH`` too), or a ``(host, port)`` tuple.
    :class:`InvalidAddressError` for anything else."""
    if isinstance(address, Address):
        return address
    if isinstance(address, tuple):
        if len(address) != 2 or not isinstance(address[0], str):
            raise _invalid(address)
        return Address(_host(address[0], address), _port(address[1], address))
    if not isinstance(address, str):
        raise _invalid(address)
    if address.startswith("unix:"):
        path = address[5:]
        if path.startswith("//"):  # unix:///path: a URL without a host
            path = path[2:]
            if not path.startswith("/"):
                raise _invalid(address, "unix:// takes no host: unix:///absolute/path")
        if not path or "\0" in path:
            raise _invalid(address, "name the socket's file: unix:/run/beanstalkd.sock")
        return Address(path=path)
    rest, default = address, None
    if address.startswith("beanstalk://"):
        rest, default = address[len("beanstalk://"):], DEFAULT_PORT
    elif "://" in address:
        raise _invalid(address, "the only URL scheme is beanstalk://")
    port_text: str | None
    if rest.startswith("["):  # [IPv6] or [IPv6]:PORT
        end = rest.find("]")
        host, tail = rest[1:end], rest[end + 1:]
        if end < 0 or ":" not in host or (tail and not tail.startswith(":")):
            raise _invalid(address, "write an IPv6 address in brackets: [::1]:11300")
        port_text = tail[1:] if tail else None
    else:
        host, sep, port_text = rest.rpartition(":")
        if not sep:
            host, port_text = rest, None
        elif ":" in host:
            raise _invalid(address, "write an IPv6 address in brackets: [::1]:11300")
    if port_text is None:
        if default is None:
            raise _invalid(address, f"give the port: {host}:{DEFAULT_PORT}, or "
                           f"beanstalk://{host} for {DEFAULT_PORT}")
        return Address(_host(host, address), default)
    if not port_text.isdigit() or not port_text.isascii():
        raise _invalid(address, "the port is a number, 1 to 65535")
    return Address(_host(host, address), _port(int(port_text), address))


def _host(host: str, address: object) -> str:
    if not host or any(c.isspace() or c in "/[]@?#" for c in host):
        raise _invalid(address, "name a host: a name, an IPv4 address or [an IPv6 address]")
    return host


def _port(port: object, address: object) -> int:
    if type(port) is not int or not 0 < port < 65536:
        raise _invalid(address, "the port is a number, 1 to 65535")
    return port


def _invalid(address: object, why: str = "") -> InvalidAddressError:
    return InvalidAddressError(f"{address!r} is not a beanstalkd server's address"
                               + (f": {why}" if why else ""), hint=f"use {_FORMS}")
