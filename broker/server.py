"""The broker process: one asyncio loop owning the engine, its store, the mc0 ROUTER and (later) the TCP
gateways.

No locks anywhere, because one thread touches the state. Every long-lived task runs under one
``asyncio.TaskGroup``, so a task that crashes stops the broker loudly instead of dying in silence; a store
failure (a failed fsync, a corrupt sealed segment) is such a crash, on purpose. SIGINT/SIGTERM stop it
gracefully: the logs are written and fsynced before the process exits. SIGHUP re-reads the CURVE allow-list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.asyncio

from broker import auth
from broker.config import BrokerConfig
from broker.engine import Engine
from broker.router import RouterShell
from broker.store.files import FileStore
from connector import keys

log = logging.getLogger("mc0.broker")


def ensure_keys(config: BrokerConfig) -> list[Path]:
    """Create the broker and default client certificates on first run (CURVE only); returns files written."""
    if not config.curve or (Path(config.keys_dir) / f"{keys.BROKER}.key_secret").exists():
        return []
    return keys.generate(Path(config.keys_dir))


@dataclass
class Broker:
    """A running broker: what tests and the CLI need to reach it."""

    config: BrokerConfig
    engine: Engine
    router: RouterShell
    endpoint: str  # the resolved bind address, e.g. tcp://127.0.0.1:49152
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)

    def stop(self) -> None:
        self.stop_event.set()


def _router_socket(context: zmq.asyncio.Context, config: BrokerConfig) -> zmq.asyncio.Socket:
    socket = context.socket(zmq.ROUTER)
    socket.router_mandatory = 1  # a send to a vanished peer raises EHOSTUNREACH instead of vanishing
    socket.router_handover = 1  # a client reconnecting with the same identity takes over its session
    socket.sndhwm = config.send_hwm
    socket.rcvhwm = config.recv_hwm
    socket.maxmsgsize = config.max_message_size
    socket.linger = 0
    return socket


async def serve(config: BrokerConfig, on_ready: Callable[[Broker], None] | None = None) -> None:
    """Run a broker until ``Broker.stop()`` (or a signal in :func:`run`)."""
    # Opening the store recovers every persistent topic (torn tails cut, ids continued) before any client
    # can connect; a corrupt sealed segment stops the start here, loudly.
    engine = Engine(config.topic_rules(), FileStore(config.data_dir))
    context = zmq.asyncio.Context()
    socket = _router_socket(context, config)
    authenticator = None
    try:
        if config.curve:
            authenticator = auth.secure(context, socket, config.keys_dir, config.allow_any_client)
        else:
            log.warning("CURVE is OFF: traffic on %s is plaintext and any client is admitted", config.bind)
        socket.bind(config.bind)
        endpoint = socket.last_endpoint.decode()
        router = RouterShell(
            engine, socket, pending_limit=config.pending_limit, tick=config.heartbeat_tick,
            weak_sync_interval=config.weak_sync_interval, retention_interval=config.retention_interval,
        )
        broker = Broker(config, engine, router, endpoint)
        log.info("mc0 broker listening on %s (CURVE %s)", endpoint, "on" if config.curve else "OFF")
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            # Always handled, so a SIGHUP meant for reloading never kills a broker that has nothing to reload.
            if authenticator is not None:
                loop.add_signal_handler(
                    signal.SIGHUP, auth.reload, authenticator, config.keys_dir, config.allow_any_client
                )
            else:
                loop.add_signal_handler(signal.SIGHUP, log.info, "SIGHUP: CURVE is off, nothing to reload")
        if on_ready is not None:
            on_ready(broker)
        async with asyncio.TaskGroup() as group:
            router_task = group.create_task(router.run(), name="mc0-router")
            stopper = group.create_task(broker.stop_event.wait(), name="stop")
            await asyncio.wait({router_task, stopper}, return_when=asyncio.FIRST_COMPLETED)
            router_task.cancel()
            stopper.cancel()
        log.info("mc0 broker stopped")
    finally:
        try:
            engine.close()  # every log written and fsynced, whatever its sync level
        finally:
            if authenticator is not None:
                authenticator.stop()
            socket.close(linger=0)
            context.term()


def run(config: BrokerConfig, on_ready: Callable[[Broker], None] | None = None) -> None:
    """Blocking entry point for the CLI and the container: serve until SIGINT or SIGTERM."""

    async def main() -> None:
        def ready(broker: Broker) -> None:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, broker.stop)
            if on_ready is not None:
                on_ready(broker)

        await serve(config, ready)

    asyncio.run(main())
