"""k7core.beanstalk: the beanstalkd 1.12 wire protocol, sans-I/O.

:class:`RequestParser` turns a connection's bytes into requests exactly as beanstalkd's
``prot.c`` parses them; the reply builders make its replies byte for byte. The client's
half (:func:`command`, :func:`put_command`, :class:`ReplyParser`) is here too. The server
over a job store is ``k7async.server``.
"""

from .protocol import DEFAULT_MAX_JOB_SIZE as DEFAULT_MAX_JOB_SIZE
from .protocol import DEFAULT_PORT as DEFAULT_PORT
from .protocol import LINE_MAX as LINE_MAX
from .protocol import MAX_JOB_SIZE_LIMIT as MAX_JOB_SIZE_LIMIT
from .protocol import NAME_MAX as NAME_MAX
from .protocol import VERSION as VERSION
from .protocol import Op as Op
from .protocol import ProtocolError as ProtocolError
from .protocol import Reply as Reply
from .protocol import ReplyParser as ReplyParser
from .protocol import Request as Request
from .protocol import RequestParser as RequestParser
from .protocol import command as command
from .protocol import put_command as put_command

__all__ = [
    "DEFAULT_MAX_JOB_SIZE",
    "DEFAULT_PORT",
    "LINE_MAX",
    "MAX_JOB_SIZE_LIMIT",
    "NAME_MAX",
    "VERSION",
    "Op",
    "ProtocolError",
    "Reply",
    "ReplyParser",
    "Request",
    "RequestParser",
    "command",
    "put_command",
]
