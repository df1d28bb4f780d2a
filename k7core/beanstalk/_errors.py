"""The errors of the beanstalkd clients: a server's failure replies, and the connection's own
failures. (:class:`~k7core.beanstalk.ProtocolError`, bytes that are no beanstalkd reply, is
the protocol module's.)"""

from __future__ import annotations

from .._errors import K7Error
from ..jobs import JobNotFoundError as _StoreJobNotFoundError


class BeanstalkError(K7Error):
    """The server answered a command with a failure reply. ``reply`` is the reply's word
    (``"NOT_FOUND"``, ``"DRAINING"``...), ``command`` the command line that got it (without a
    put's body). The connection is still good: other commands may follow."""

    def __init__(self, message: str, *, reply: str, command: str, hint: str | None = None):
        super().__init__(f"{command}: {reply}: {message}", hint=hint)
        self.reply = reply
        self.command = command


class JobNotFoundError(BeanstalkError, _StoreJobNotFoundError):
    """``NOT_FOUND`` to a command that names a job (delete, release, bury, touch, kick-job,
    stats-job, reserve-job): no such job, or it is reserved by another connection, or (release,
    bury, touch) not reserved by this one, or (kick-job) neither buried nor delayed, or
    (reserve-job) already reserved. Also a :class:`k7core.jobs.JobNotFoundError`, which the
    in-process job store raises in the same cases: one ``except`` serves both. ``job_id`` is
    the id asked for."""

    def __init__(self, message: str, *, reply: str, command: str, job_id: int,
                 hint: str | None = None):
        super().__init__(message, reply=reply, command=command, hint=hint)
        self.job_id = job_id


class TubeNotFoundError(BeanstalkError):
    """``NOT_FOUND`` to stats-tube or pause-tube: the server has no such tube (a tube exists
    while it has jobs or a connection uses or watches it)."""


class JobBuriedError(BeanstalkError):
    """``BURIED``: the server ran out of memory to queue the job, so it buried it: after a put
    (the job is stored, ``job_id`` is its new id) or a release. Kick it when the server has
    memory again."""

    def __init__(self, message: str, *, reply: str, command: str, job_id: int,
                 hint: str | None = None):
        super().__init__(message, reply=reply, command=command, hint=hint)
        self.job_id = job_id


class JobTooBigError(BeanstalkError, ValueError):
    """``JOB_TOO_BIG``: the body is larger than the server's maximum job size (its ``-z``,
    ``max-job-size`` in ``stats``). Nothing was stored."""


class DrainingError(BeanstalkError):
    """``DRAINING``: the server is in drain mode and takes no new job. Put it elsewhere."""


class DeadlineSoonError(BeanstalkError):
    """``DEADLINE_SOON`` to a reserve: a job this connection reserved has less than a second of
    its time-to-run left. Delete, release, bury or touch it, then reserve again."""


class NotIgnoredError(BeanstalkError):
    """``NOT_IGNORED``: ignore would leave the connection watching no tube. Watch another one
    first."""


class ServerError(BeanstalkError):
    """``OUT_OF_MEMORY`` or ``INTERNAL_ERROR``: the server failed to do the command. Retry
    later; look at the server's log."""


class RejectedCommandError(BeanstalkError):
    """``BAD_FORMAT``, ``UNKNOWN_COMMAND`` or ``EXPECTED_CRLF``: the server did not understand
    the bytes it got. The clients check every argument first, so from them it means a bug, or a
    server that speaks another protocol than beanstalkd 1.12."""


class InvalidAddressError(K7Error, ValueError):
    """A server address the clients cannot read (see ``parse_address`` for the forms)."""


class BeanstalkConnectionError(K7Error, ConnectionError):
    """The connection to the server could not be made, or it broke: the server closed it, the
    network failed, a reply did not come in time (:class:`BeanstalkTimeoutError`), or a call
    was cancelled halfway. A broken client stays closed: connect a new one. The server has put
    the jobs reserved over the old connection back to ready."""


class BeanstalkTimeoutError(BeanstalkConnectionError, TimeoutError):
    """No reply (or no connection) within the client's ``timeout``; the client is closed, since
    a reply may still come. Connect again, with a longer ``timeout`` if the server is slow."""
