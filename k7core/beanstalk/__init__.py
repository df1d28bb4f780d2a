"""k7core.beanstalk: the beanstalkd 1.12 wire protocol, sans-I/O, and a client.

:class:`RequestParser` turns a connection's bytes into requests exactly as beanstalkd's
``prot.c`` parses them; the reply builders make its replies byte for byte. The client's
half: :func:`command`, :func:`put_command`, :class:`ReplyParser`, and :mod:`.calls`, every
command as a :class:`Call` (its request, what its replies mean), which :class:`Client` (here,
blocking) and ``k7async.beanstalk.AsyncClient`` send. The server over a job store is
``k7async.server``.
"""

from ._address import Address as Address
from ._address import parse_address as parse_address
from ._client import Client as Client
from ._errors import BeanstalkConnectionError as BeanstalkConnectionError
from ._errors import BeanstalkError as BeanstalkError
from ._errors import BeanstalkTimeoutError as BeanstalkTimeoutError
from ._errors import DeadlineSoonError as DeadlineSoonError
from ._errors import DrainingError as DrainingError
from ._errors import InvalidAddressError as InvalidAddressError
from ._errors import JobBuriedError as JobBuriedError
from ._errors import JobNotFoundError as JobNotFoundError
from ._errors import JobTooBigError as JobTooBigError
from ._errors import NotIgnoredError as NotIgnoredError
from ._errors import RejectedCommandError as RejectedCommandError
from ._errors import ServerError as ServerError
from ._errors import TubeNotFoundError as TubeNotFoundError
from ._state import ClientState as ClientState
from .calls import DEFAULT_PRIORITY as DEFAULT_PRIORITY
from .calls import DEFAULT_TTR as DEFAULT_TTR
from .calls import Call as Call
from .calls import PeekedJob as PeekedJob
from .calls import ReservedJob as ReservedJob
from .calls import Stats as Stats
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
    "DEFAULT_PRIORITY",
    "DEFAULT_TTR",
    "LINE_MAX",
    "MAX_JOB_SIZE_LIMIT",
    "NAME_MAX",
    "VERSION",
    "Address",
    "BeanstalkConnectionError",
    "BeanstalkError",
    "BeanstalkTimeoutError",
    "Call",
    "Client",
    "ClientState",
    "DeadlineSoonError",
    "DrainingError",
    "InvalidAddressError",
    "JobBuriedError",
    "JobNotFoundError",
    "JobTooBigError",
    "NotIgnoredError",
    "Op",
    "PeekedJob",
    "ProtocolError",
    "RejectedCommandError",
    "Reply",
    "ReplyParser",
    "Request",
    "RequestParser",
    "ReservedJob",
    "ServerError",
    "Stats",
    "TubeNotFoundError",
    "command",
    "parse_address",
    "put_command",
]

# The objects of the private modules report this package as their module (as k7core.jobs's
# do); protocol's and calls' are at home in those public modules.
for _value in [globals()[name] for name in __all__]:
    if getattr(_value, "__module__", "").startswith(__name__ + "._"):
        _value.__module__ = __name__
del _value
