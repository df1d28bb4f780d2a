"""What a relay checks before it moves rows, the same for every relay: the outbox feeds this
relay's job store or server (the first relay binds it, in ``<table>_meta``), and its ids
did not go back below what was relayed (a restored database, a table made again by hand, a
reset sequence). Either refusal names the outbox and ``k7 outbox reset``, the way out."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from contextlib import suppress
from typing import NamedTuple

from .._storage import fsync_dir, fsync_file, open_fd, storage_error
from ..beanstalk import parse_address
from ..jobs._store import JobStore
from ._errors import OutboxRewoundError, OutboxTargetError

STORE_ID = "k7-store.id"
"""The file, in a job store's directory, holding the store's identity (32 random hex
digits, made by the first relay into it): what an outbox's binding names."""

RESET = "k7 outbox reset SOURCE"


class Target(NamedTuple):
    """Where a relay puts jobs: ``id`` is what the binding compares (``store <hex>``,
    ``beanstalk <address>``), ``where`` says it to people."""

    id: str
    where: str


def store_target(store: JobStore) -> Target:
    """The identity of ``store``: its id file, made (durably, once) if missing."""
    path = store.path / STORE_ID
    if not path.exists():
        tmp = path.with_name(f".{STORE_ID}.{os.getpid()}.{secrets.token_hex(4)}")
        try:
            fd = open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, f"{secrets.token_hex(16)}\n".encode())
                fsync_file(fd, tmp)
            finally:
                os.close(fd)
            with suppress(FileExistsError):  # another relay made it first: that one
                os.link(tmp, path)
        except OSError as exc:  # a full disk: a StorageError that says so, no file left
            raise storage_error(exc, path, "make the job store's identity file") from exc
        finally:
            with suppress(FileNotFoundError):
                os.unlink(tmp)
        fsync_dir(store.path)
    return Target(f"store {path.read_text().strip()}",
                  f"the job store {store.path.resolve()}")


def server_target(address: str) -> Target:
    """The identity of the beanstalkd server at ``address`` (the address, as parsed)."""
    parsed = str(parse_address(address))
    return Target(f"beanstalk {parsed}", f"the beanstalkd server {parsed}")


Bound = tuple[str | None, str | None]
"""An outbox's ``target`` and ``target_where`` columns (None: not bound yet)."""


def check_target(outbox: str, bound: Bound, mine: Target, bind: Callable[[], Bound]) -> None:
    """Refuse (:class:`OutboxTargetError`) unless ``outbox`` feeds ``mine``; an outbox not
    bound yet is bound by ``bind`` (which writes ``mine`` if still unbound, and returns
    the binding then: another relay may have bound it first)."""
    if bound[0] is None:
        bound = bind()
    if bound[0] != mine.id:
        same = (f" (the same place, another identity: the store was made again or its "
                f"{STORE_ID} lost)" if bound[1] == mine.where else "")
        raise OutboxTargetError(
            f"{outbox} feeds {bound[1]}, not {mine.where}{same}: one outbox feeds one store "
            "or server, or a row could be relayed into both; nothing was relayed",
            hint=f"relay into that one; if it is gone for good, `{RESET}` binds the next "
                 "relay's and relays there every row still in the table")


def check_ids(outbox: str, *, relayed: int, highest: int, taken: int | None = None) -> None:
    """Refuse (:class:`OutboxRewoundError`) when the outbox's ids went back: ``relayed`` is
    the highest row id its store holds (its mark; 0: none), ``highest`` the highest id the
    table's ids have reached, ``taken`` (store relays) the highest id the database says
    relays may take (None: not known)."""
    if taken is not None and taken < relayed:
        why = (f"its store holds rows up to id {relayed} but the database says relays "
               f"took rows up to {taken} only: the database went back (restored from a "
               "backup?)")
        known = f"the rows up to id {taken} were relayed before; "
    elif highest < max(relayed, taken or 0):
        why = (f"its ids went back: they reach {highest}, but rows up to id "
               f"{max(relayed, taken or 0)} were relayed (the database restored, the table "
               "made again by hand or its id sequence reset?)")
        known = ""
    else:
        return
    raise OutboxRewoundError(
        f"{outbox}: {why}; a relay would skip new rows with those ids (or relay rows again), "
        "so nothing was relayed or deleted",
        hint=f"{known}rows that were relayed before can be deleted with `{RESET} "
             f"--skip-upto ID`, which relays the rest; `{RESET}` relays every row in the "
             "table")
