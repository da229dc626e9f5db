"""kombu's Redis and Sentinel transports, with one Redis client per channel instead of one per publish and ack.

kombu builds a new ``redis.Redis`` (over the same connection pool) for every message it publishes
and every ack; redis-py 8 fills a table of ~300 response callbacks in each, which measured 5 % of a
worker's CPU. A client over a pool is safe to share between threads and greenlets, so the channel
keeps one, and builds a new one only when its pool was replaced (after a fork or a disconnect).
Two more, for the driver's save (``shared.step_sender``): a publish whose Redis command is taken rather
than sent (:func:`capturing`), and an acknowledgement a save already made on Redis
(:func:`acknowledged_by_save`), whose ack then costs no round trip. Everything else is kombu's: the
Sentinel channel asks the sentinels for the primary's address on each
new connection, and its pool drops its connections when that address changed (a failover).

One guard: a channel whose connection already let go of its transport (``transport.client`` is None)
raises a Redis ``ConnectionError`` instead of building a pool. Celery 5.7's consumer, on a lost broker
connection, first ``collect()``s the connection (which lets go of the transport even when closing its
channel failed midway) and then ``close()``s it; the second close runs the channel's close again, whose
requeue of unacknowledged messages builds a pool from the transport's client, and kombu raised an
``AttributeError`` that ended the worker ("Unrecoverable error"). A connection error there is what
kombu's close already ignores; the messages stay in the unacked index, and the visibility timeout
brings them back as it does after any lost connection.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

__all__ = ["Captured", "QoS", "SentinelTransport", "Transport", "acknowledged_by_save", "capturing"]


class _SharedClient:
    """What both channels share: their synchronous client, built once per pool; no pool once closed."""

    _shared_client: Any = None
    pool: Any
    connection: Any

    def _get_pool(self, asynchronous: bool = False) -> Any:
        if self.connection.client is None:
            raise redis.ConnectionError("the broker connection of this channel is closed")
        return super()._get_pool(asynchronous=asynchronous)  # type: ignore[misc]  # a mixin over kombu's channels

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[misc]  # a mixin over kombu's channels
        client = self._shared_client
        if client is None or client.connection_pool is not self.pool:
            client = self._shared_client = super()._create_client()  # type: ignore[misc]
        return client


class Captured:
    """The Redis commands kombu's Redis transport would send to publish one message, taken instead of sent.

    kombu's producer batches (``Producer.batch``) route each message through the channel as for a
    publish, and give the batch the final Redis commands (``PublishBatch.add``); inside
    :func:`capturing`, a :class:`Channel` hands them this object, which keeps them and sends nothing.
    The message is kombu's own, byte for byte, with a delivery tag of its own. The step sender
    (``shared.step_sender``) gives the command to the state store's save, which runs it in its
    round trip.
    """

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.commands: list[tuple[str, tuple[Any, ...]]] = []

    def publish(self, message: Any, **kwargs: Any) -> Any:
        return self.channel.basic_publish(message, _publish_batch=self, **kwargs)

    def add(self, name: str, *args: Any) -> None:
        self.commands.append((name, args))

    def flush(self) -> None:
        """Nothing to send: the commands are the caller's."""

    def discard(self) -> None:
        self.commands.clear()

    def close(self) -> None:
        """Nothing to close."""


_capture = threading.local()  # gevent's monkey-patching makes it one per greenlet


@contextmanager
def capturing() -> Iterator[list[Captured]]:
    """Within the block, a :class:`Channel`'s producer batches take their commands instead of sending
    them; the list yielded gets each batch's :class:`Captured` (in this thread or greenlet only)."""
    taken: list[Captured] = []
    _capture.taken = taken
    try:
        yield taken
    finally:
        _capture.taken = None


_ACKED_KEPT = 10000
"""Delivery tags :func:`acknowledged_by_save` remembers for the ack that follows (a prefork pool's child saves,
its parent acks: the child's tags are forgotten oldest first, and such an ack costs its round trip)."""
_acked_by_save: OrderedDict[str, None] = OrderedDict()
_acked_lock = threading.Lock()


def acknowledged_by_save(delivery_tag: str) -> None:
    """Say that the message of ``delivery_tag`` was acknowledged on Redis by the save of its step's state
    (``shared.state.BrokerPush.ack``): kombu's ack of it in this process then only forgets it in memory."""
    with _acked_lock:
        _acked_by_save[delivery_tag] = None
        while len(_acked_by_save) > _ACKED_KEPT:
            _acked_by_save.popitem(last=False)


class QoS(kombu_redis.QoS):
    """kombu's Redis acknowledgements, minus the round trip of an ack a save already made on Redis."""

    def ack(self, delivery_tag: Any) -> None:
        with _acked_lock:
            done = _acked_by_save.pop(delivery_tag, False) is None
        if done:
            virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]  # kombu is untyped
            return
        super().ack(delivery_tag)  # type: ignore[no-untyped-call]


class Channel(_SharedClient, kombu_redis.Channel):
    """A Redis channel that reuses its synchronous client, whose publishes can be taken (:func:`capturing`),
    and whose acks skip Redis for messages a save acknowledged there (:func:`acknowledged_by_save`)."""

    QoS = QoS

    def create_publish_batch(self, max_size: int) -> Any:
        taken = getattr(_capture, "taken", None)
        if taken is None:
            return super().create_publish_batch(max_size)  # type: ignore[no-untyped-call]  # kombu is untyped
        batch = Captured(self)
        taken.append(batch)
        return batch


class SentinelChannel(_SharedClient, kombu_redis.SentinelChannel):
    """A Redis Sentinel channel that reuses its synchronous client."""


class Transport(kombu_redis.Transport):
    """kombu's Redis transport on :class:`Channel`."""

    Channel = Channel


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Redis Sentinel transport on :class:`SentinelChannel`."""

    Channel = SentinelChannel
