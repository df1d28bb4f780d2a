"""``run_relay``: an outbox relay (``k7core.outbox``) as a task of the caller's task group.

The relay itself runs on its own thread, as the sync core's owners do; the task holds it
for the task group's lifetime and closes it (joining the thread off the event loop) when
cancelled."""

from __future__ import annotations

import anyio
from anyio.abc import TaskStatus

from k7core.outbox import Relay


async def run_relay(relay: Relay, *,
                    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Relay until cancelled. ``await tg.start(run_relay, relay)`` returns once a first
    batch was relayed (a missing table or a bad DSN raises there); ``tg.start_soon`` does
    not wait. For a :class:`k7async.AsyncJobStore`, build the relay on its ``.store``."""
    try:
        await anyio.to_thread.run_sync(relay.relay_once)
        relay.start()
        task_status.started()
        await anyio.sleep_forever()
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(relay.close)
