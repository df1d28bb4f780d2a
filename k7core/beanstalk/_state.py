"""What both clients know of their connection besides its bytes: open, closed or broken, and
the error each failure becomes."""

from __future__ import annotations

from .._checks import check_seconds
from .._errors import ClosedError
from ._errors import BeanstalkConnectionError, BeanstalkTimeoutError
from .calls import Call
from .protocol import ReplyParser


class ClientState:
    """A client's connection, less the I/O: ``name`` (the server, for messages), ``timeout``
    (checked: seconds > 0, or None), the :class:`ReplyParser` of its replies, and whether it
    was closed or broke. A face (``Client``, ``AsyncClient``) asks :meth:`check` before each
    call, and :meth:`failed` what to raise when sending or receiving failed, then closes its
    transport."""

    def __init__(self, name: str, timeout: float | None) -> None:
        self.name = name
        self.timeout = None if timeout is None else check_seconds(timeout, "timeout",
                                                                   positive=True)
        self.parser = ReplyParser()
        self.closed = False
        """True once the face's close was called."""
        self.broken = ""
        """Why the connection broke, once it did (empty before)."""

    @property
    def ended(self) -> bool:
        """True once closed or broken."""
        return self.closed or bool(self.broken)

    def check(self) -> None:
        """Raise unless a call may use the connection."""
        if self.closed:
            raise ClosedError(f"the client of {self.name} is closed", hint="connect a new one")
        if self.broken:
            raise BeanstalkConnectionError(f"the connection to {self.name} broke earlier: "
                                           f"{self.broken}", hint="connect a new client")

    def connect_failed(self, error: Exception) -> BeanstalkConnectionError:
        """What to raise when connecting raised ``error`` (a TimeoutError, or an OSError)."""
        if isinstance(error, TimeoutError):
            return BeanstalkTimeoutError(f"no connection to {self.name} within {self.timeout} s",
                                         hint="is the server up and reachable?")
        return BeanstalkConnectionError(f"cannot connect to {self.name}: {error}",
                                        hint="is the server running there?")

    def failed(self, call: Call[object], error: BaseException,
               lost: tuple[type[BaseException], ...]) -> BaseException:
        """Sending ``call``, reading its reply or reading its meaning raised ``error`` (not a
        :class:`BeanstalkError`: a failure reply leaves the connection good): its state is
        unknown, so it is broken now (the face closes its transport). What to raise: ``error``
        itself when it is no Exception (a cancellation, KeyboardInterrupt) or a
        :class:`ProtocolError`; :class:`k7core.ClosedError` when the face was closed meanwhile;
        :class:`BeanstalkTimeoutError` for a TimeoutError; :class:`BeanstalkConnectionError`
        for the ``lost`` kinds (the transport's end of stream, reset...)."""
        if self.closed and isinstance(error, Exception):
            return ClosedError(f"the client of {self.name} was closed during "
                               f"{call.command!r}", hint="connect a new one")
        self.broken = f"{call.command!r} got {type(error).__name__} {error}".rstrip()
        if not isinstance(error, Exception):
            return error
        if isinstance(error, TimeoutError):
            return BeanstalkTimeoutError(
                f"no reply to {call.command!r} from {self.name} within "
                f"{call.reply_limit(self.timeout)} s; the client is closed",
                hint="connect again, with a longer timeout if the server is slow")
        if isinstance(error, lost):
            return BeanstalkConnectionError(
                f"the connection to {self.name} broke during {call.command!r}: "
                + (str(error) or "the server closed it"), hint="connect a new client")
        return error
