"""The broker process: one asyncio loop owning the engine, its store, the hub that drives their turn, the
mc0 ROUTER and the TCP gateways.

No locks anywhere, because one thread touches the state. Every long-lived task runs under one
``asyncio.TaskGroup``, so a task that crashes stops the broker loudly instead of dying in silence; a failed
fsync of data already promised is such a crash, on purpose. Anything else a request runs into (a file that
will not open, a damaged record, a limit) fails that request only. SIGINT/SIGTERM stop it gracefully: the logs
are written and fsynced before the process exits. SIGHUP re-reads the CURVE allow-list.

At start the descriptor limit is raised to the hard limit and shared out (:mod:`broker.descriptors`): the
store keeps at most its share open, and the doors stop accepting while the rest runs short. The data directory
is checked before anything listens: one that cannot work is refused in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import errno
import functools
import logging
import signal
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils import z85

from broker import auth, descriptors
from broker.config import BrokerConfig, ConfigError, check_engine
from broker.engine import Engine
from broker.gateways.lumberjack import LumberjackConnection, LumberjackOptions, field_path
from broker.gateways.msgq import MsgqConnection, MsgqOptions
from broker.gateways.rstreams import RStreamsConnection, RStreamsOptions
from broker.gateways.sexp import SexpConnection, SexpOptions
from broker.gateways.tcp import Gateway, InputBudget
from broker.hub import MAX_RETRY, Hub
from broker.listener import Listener, open_listener
from broker.monitoring import Monitor
from broker.router import RouterShell
from broker.store import StoreError, SyncFailed, segment
from broker.store.files import FileStore
from broker.zmtp_door import ZmtpDoor
from connector import addresses, keys

log = logging.getLogger("mc0.broker")


#: glibc's mallopt() parameter M_MMAP_THRESHOLD, and the size from which allocations get pages of their own.
_M_MMAP_THRESHOLD = -3
_MMAP_FROM = 1 << 20
#: glibc's M_TRIM_THRESHOLD, and how much free memory the heap keeps at its top before giving it back.
_M_TRIM_THRESHOLD = -1
_TRIM_FROM = 8 << 20


def return_large_frees() -> bool:
    """Have large allocations (a client's long line, a big message) given back to the system when freed.

    glibc raises its mmap threshold each time a large block is freed, so the next ones come from the heap,
    and a heap does not shrink past what is still in use above: a few clients sending 20 MiB lines leave the
    broker 100 MB larger for good. A fixed threshold keeps every block of a megabyte or more in pages of its
    own, unmapped when freed. (Range reads, which would pay for fresh pages on every reply, fill a few buffers
    the store keeps: broker.store.buffers.)

    glibc moves the heap's trim threshold with the mmap threshold (to twice it); fixed, it stays at its
    default of 128 KiB, so every time more than that lay free at the heap's top it went back to the system,
    and came back a page fault at a time (the kernel zeroing each) with the next allocations. A loop turn that
    stores a few PUTS of a pipelining publisher frees a few MB of batches there: a Spark write of 1,000,000
    rows cost the broker 10,000-79,000 page faults. The heap keeps up to ``_TRIM_FROM`` (8 MiB) free at its
    top instead. True if both were set (glibc only: elsewhere nothing changes)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_FROM)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_FROM))
    except (OSError, AttributeError):
        return False


_accept_failures = [float("-inf")]  # when the last was logged


def _loop_exceptions(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's error reports, less two that a descriptor shortage makes and that need no traceback: an
    accept without a descriptor (asyncio retries a second later, and our doors pause), and that retry on a
    server the pause closed meanwhile."""
    error = context.get("exception")
    if isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE):
        now = loop.time()
        if now - _accept_failures[0] >= 5.0:  # said once in a while, not once per connection
            _accept_failures[0] = now
            log.warning("a door could not accept a connection: %s (the doors pause while descriptors are "
                        "short)", error.strerror)
        return
    handle = context.get("handle")
    if isinstance(error, ValueError) and "_start_serving" in repr(handle):
        return
    loop.default_exception_handler(context)


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
    hub: Hub
    router: RouterShell
    endpoint: str  # the resolved bind address, e.g. tcp://127.0.0.1:49152
    gateways: dict[str, Gateway] = field(default_factory=dict)  # the ones turned on, by name
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    # The mc0 port's connection and handshake counters: libzmq's socket monitor, or the native engine's own.
    handshakes: auth.HandshakeWatch | ZmtpDoor | None = None
    monitor: Monitor | None = None  # the HTTP monitoring endpoint, when on

    @property
    def http_address(self) -> tuple[str, int] | None:
        """Where the monitoring endpoint listens (None: off, or its default port was taken)."""
        return None if self.monitor is None else self.monitor.address
    descriptors: descriptors.DescriptorWatch | None = None

    def gateway_address(self, name: str) -> tuple[str, int]:
        """Where gateway ``name`` really listens (a configured port 0 resolved)."""
        address = self.gateways[name].address
        assert address is not None
        return address

    def stop(self) -> None:
        self.stop_event.set()


def _gateways(config: BrokerConfig, hub: Hub, budget: InputBudget) -> dict[str, Gateway]:
    """The TCP gateways the configuration turns on (not listening yet), sharing one input budget."""
    gateways = {}
    shared = {"pending_limit": config.pending_limit, "input_budget": budget,
              "handshake_timeout": config.handshake_timeout}
    sexp = config.gateway_address("sexp")
    if sexp is not None:
        interval = config.sexp_ping_interval
        # Ticks a few times per ping interval so Pings and expiry keep close to their times, at most 1/s.
        gateways["sexp"] = Gateway(
            "sexp", hub, SexpConnection, host=sexp[0], port=sexp[1], tick=min(1.0, interval / 4),
            options=SexpOptions(ping_interval=interval, max_line=4 * config.max_message_size + 1024),
            **shared,
        )
    msgq = config.gateway_address("msgq")
    if msgq is not None:
        # msgq has no liveness rule of its own (TCP tells us when a peer goes): the tick runs the handshake
        # timeout only.
        gateways["msgq"] = Gateway(
            "msgq", hub, MsgqConnection, host=msgq[0], port=msgq[1], tick=1.0,
            options=MsgqOptions(max_message=config.msgq_max_message), **shared,
        )
    rstreams = config.gateway_address("rstreams")
    if rstreams is not None:
        gateways["rstreams"] = Gateway(
            "rstreams", hub, RStreamsConnection, host=rstreams[0], port=rstreams[1], tick=1.0,
            options=RStreamsOptions(max_message=config.max_message_size, part_size=config.rstreams_part_size,
                                    buffer=config.pending_limit),
            **shared,
        )
    shipping = config.gateway_address("lumberjack")
    if shipping is not None:
        if not config.lumberjack_topic:
            raise ConfigError("lumberjack_topic must name a topic")
        # Ticks every second: v2 keepalives are due at most every 5 s while a batch waits.
        gateways["lumberjack"] = Gateway(
            "lumberjack", hub, LumberjackConnection, host=shipping[0], port=shipping[1], tick=1.0,
            ssl_context=_lumberjack_tls(config),
            options=LumberjackOptions(topic=config.lumberjack_topic.encode(),
                                      topic_field=field_path(config.lumberjack_topic_field),
                                      max_frame=config.max_message_size),
            **shared,
        )
    return gateways


class _RouterDoor:
    """The mc0 port as a door the descriptor watch can pause. Where the broker holds the listening socket
    (:mod:`broker.listener`), a pause makes the kernel leave new connection attempts unanswered and every mc0
    connection carries on; only :meth:`shed`, when a file could not be opened for want of descriptors,
    unbinds the endpoint, which closes every connection accepted through it (half-open handshakes included:
    their descriptors come back at once), and mc0 clients reconnect once it is bound again. Where the broker
    does not hold the socket, a pause unbinds as a shed does."""

    name = "mc0"

    def __init__(self, socket: zmq.asyncio.Socket, endpoint: str, listener: Listener | None) -> None:
        self.socket = socket
        self.endpoint = endpoint
        self.listener = listener
        self.bound = True

    def pause(self) -> None:
        if self.listener is None:
            self.shed()
        elif self.bound:
            self.listener.hold()

    def shed(self) -> None:
        if not self.bound:
            return
        try:
            self.socket.unbind(self.endpoint)
        except zmq.ZMQError as error:
            raise OSError(error.errno, f"unbind {self.endpoint}: {error}") from None
        self.bound = False
        log.warning("mc0 door: %s unbound for want of descriptors, which closes its connections: clients "
                    "reconnect once it is bound again", self.endpoint)
        if self.listener is not None:  # closed, so that connections waiting in its backlog are refused too
            self.listener.close()
            self.listener = None

    def resume(self) -> None:
        if self.bound:
            if self.listener is not None:
                self.listener.release()
            return
        self.listener = _bind_router(self.socket, self.endpoint)
        self.bound = True

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None


def _bind_router(socket: zmq.asyncio.Socket, endpoint: str) -> Listener | None:
    """Bind the ROUTER to ``endpoint`` through a listening socket of the broker's where it can make one
    (:mod:`broker.listener`), else as libzmq does; returns that socket. OSError when it cannot bind."""
    try:
        listener = open_listener(endpoint, socket.getsockopt(zmq.BACKLOG))
    except OSError as error:
        raise OSError(error.errno, f"bind {endpoint}: {error.strerror}") from None
    try:
        if listener is not None:
            socket.setsockopt(zmq.USE_FD, listener.handed_over())
        try:
            socket.bind(endpoint)
        finally:
            if listener is not None:
                socket.setsockopt(zmq.USE_FD, -1)  # for this bind only
    except zmq.ZMQError as error:
        if listener is not None:
            listener.close()
        raise OSError(error.errno, f"bind {endpoint}: {error}") from None
    return listener


def _native_listener(config: BrokerConfig, backlog: int) -> Listener | None:
    """The mc0 port's listening socket when the native engine serves it: ``mc0_engine`` native, or auto on a
    TCP address the broker can listen on itself; None when libzmq's ROUTER does."""
    if config.mc0_engine == "zeromq" or not config.bind.startswith("tcp://"):
        return None  # (check_engine has refused native with another transport)
    try:
        listener = open_listener(config.bind, backlog)
    except OSError as error:
        raise OSError(error.errno, f"bind {config.bind}: {error.strerror}") from None
    if listener is None and config.mc0_engine == "native":
        raise ConfigError(f"mc0_engine 'native' cannot listen on {config.bind} itself (an interface or host "
                          "name only libzmq resolves): give an IP address, or use mc0_engine 'zeromq'")
    return listener


def _native_door(
    config: BrokerConfig, listener: Listener, allowed: auth.AllowList | None, budget: InputBudget
) -> ZmtpDoor:
    """The mc0 port served by the broker's own ZMTP engine on ``listener``, its unfinished input counted in
    ``budget``; with CURVE, the broker's key pair and ``allowed`` (None: any client key)."""
    curve_keys = None
    if config.curve:
        pair = keys.broker_pair(config.keys_dir)
        assert pair.secret is not None  # broker_pair refuses a certificate without one
        curve_keys = (z85.decode(pair.public), z85.decode(pair.secret))
    admit = None if allowed is None else functools.partial(allowed.callback, auth.ZAP_DOMAIN)
    return ZmtpDoor(listener, max_frame=config.max_message_size, send_hwm=config.send_hwm,
                    recv_hwm=config.recv_hwm,
                    handshake_timeout=config.handshake_timeout, curve_keys=curve_keys, admit=admit,
                    budget=budget)


def _lumberjack_tls(config: BrokerConfig) -> ssl.SSLContext | None:
    """TLS for the Lumberjack port when a certificate is configured; client certificates when a CA is."""
    if not config.lumberjack_tls_cert:
        if config.lumberjack_tls_key or config.lumberjack_tls_client_ca:
            raise ConfigError("lumberjack TLS needs lumberjack_tls_cert (and lumberjack_tls_key)")
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.lumberjack_tls_cert, config.lumberjack_tls_key or None)
        if config.lumberjack_tls_client_ca:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(config.lumberjack_tls_client_ca)
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(f"lumberjack TLS: {error}") from None
    return context


def _demoted(router: RouterShell, gateways: dict[str, Gateway], leader: str | None) -> None:
    """A cluster member stopped leading: the TCP doors close their connections at once; once the leader is
    known, the mc0 clients are sent there."""
    if leader is None:
        for gateway in gateways.values():
            gateway.close_all("this broker no longer leads the cluster")
        return
    router.send_away(f"this broker no longer leads the cluster: the leader is {leader}", leader.encode())


def _leading_again(router: RouterShell, endpoint: str) -> None:
    """A cluster member leads again in a new epoch, no other having led since it stopped: its mc0 subscribers
    subscribe again (the TCP doors' connections were closed when it stopped leading)."""
    router.subscribe_again("this broker leads the cluster again, in a new epoch: subscribe again here",
                           endpoint.encode())


def _router_socket(context: zmq.asyncio.Context, config: BrokerConfig) -> zmq.asyncio.Socket:
    socket = context.socket(zmq.ROUTER)
    socket.router_mandatory = 1  # a send to a vanished peer raises EHOSTUNREACH instead of vanishing
    socket.router_handover = 1  # a client reconnecting with the same identity takes over its session
    socket.sndhwm = config.send_hwm
    socket.rcvhwm = config.recv_hwm
    socket.maxmsgsize = config.max_message_size
    socket.linger = 0
    # A connection that has not finished its handshake (a bare TCP connect to the CURVE port) is dropped after
    # this, not libzmq's 30 s: each holds a descriptor meanwhile (docs/configuration.md, handshake_timeout).
    socket.handshake_ivl = int(config.handshake_timeout * 1000)
    if addresses.is_ipv6(config.bind):
        socket.ipv6 = True  # where libzmq binds it itself (broker/listener.py binds IPv6 either way)
    return socket


async def serve(config: BrokerConfig, on_ready: Callable[[Broker], None] | None = None) -> None:
    """Run a broker until ``Broker.stop()`` (or a signal in :func:`run`)."""
    check_engine(config)
    return_large_frees()
    asyncio.get_running_loop().set_exception_handler(_loop_exceptions)
    before, limit = descriptors.raise_limit()
    if limit != before:
        log.info("descriptor limit raised from %d to %d", before, limit)
    shares = descriptors.shares(limit, config.max_open_files, config.descriptor_reserve)
    # A data directory that cannot work stops the start here, in one line, before anything listens.
    store = FileStore(config.data_dir, max_open_files=shares.store)
    store.check()
    # Then the monitoring endpoint: /healthz answers (and /readyz says "starting") while the store recovers,
    # and a monitoring port asked for that is taken stops the start before any work.
    monitor = Monitor.start(config)
    try:
        await _serve(config, store, shares, monitor, on_ready)
    finally:
        if monitor is not None:
            monitor.close()


async def _serve(
    config: BrokerConfig, store: FileStore, shares: descriptors.Shares, monitor: Monitor | None,
    on_ready: Callable[[Broker], None] | None,
) -> None:
    # Opening the store recovers every persistent topic (torn tails cut, ids continued) before any client
    # can connect. A damaged topic does not stop the start (its reads fail, or it is refused, and the log
    # says which).
    engine = Engine(config.topic_rules(), store, max_topics=config.max_topics)
    hub = Hub(engine, weak_sync_interval=config.weak_sync_interval,
              retention_interval=config.retention_interval, topic_idle=config.topic_idle,
              max_retry=min(config.heartbeat_tick, MAX_RETRY))
    hub.loop = asyncio.get_running_loop()
    budget = InputBudget(config.input_budget)
    gateways = _gateways(config, hub, budget)
    context = zmq.asyncio.Context()
    socket = _router_socket(context, config)
    authenticator = None
    listener: Listener | None = None
    handshakes: auth.HandshakeWatch | None = None
    watch: descriptors.DescriptorWatch | None = None
    door: _RouterDoor | ZmtpDoor | None = None
    allowed: auth.AllowList | None = None  # the native engine's CURVE allow-list (libzmq's: ZAP's)
    try:
        listener = _native_listener(config, socket.getsockopt(zmq.BACKLOG))
        native = listener is not None
        # libzmq's socket monitor counts the mc0 port's connections and handshakes; the native engine its own.
        handshakes = auth.HandshakeWatch(socket) if not native else None
        if not config.curve:
            log.warning("CURVE is OFF: traffic on %s is plaintext and any client is admitted", config.bind)
        elif not native:
            authenticator = auth.secure(context, socket, config.keys_dir, config.allow_any_client,
                                        cluster=config.clustered)
        elif not config.allow_any_client:
            allowed = auth.allow_list(config.keys_dir, cluster=config.clustered)
        wire: ZmtpDoor | None = None
        if listener is not None:
            wire = _native_door(config, listener, allowed, budget)
            endpoint = wire.endpoint
            door = wire
        else:
            listener = _bind_router(socket, config.bind)
            endpoint = socket.last_endpoint.decode()
            door = _RouterDoor(socket, endpoint, listener)
        router = RouterShell(hub, socket, pending_limit=config.pending_limit, tick=config.heartbeat_tick,
                             max_waiting_fetches=config.max_waiting_fetches, session_idle=config.session_idle,
                             max_sessions=config.max_sessions, wire=wire)
        hub.add(router)
        cluster = None
        if config.clustered:
            from broker.cluster.node import Cluster  # PySyncObj only where a cluster runs

            cluster = Cluster(config, engine, store, hub.schedule, hub.flush, hub.fail, context, endpoint)
            router.cluster = cluster
            hub.limits["cluster"] = cluster.stats
            hub.readiness.append(cluster.unready)
            cluster.on_demoted = functools.partial(_demoted, router, gateways)
            cluster.on_leading_again = functools.partial(_leading_again, router)
            hub.ahead.append(router.answer_ahead)
            hub.after_flush.append(cluster.after_flush)
            for gateway in gateways.values():
                gateway.refusing = cluster.tcp_refusal
                gateway.replication = cluster
        for gateway in gateways.values():
            await gateway.start()
            hub.add(gateway)
        broker = Broker(config, engine, hub, router, endpoint, gateways, handshakes=handshakes or wire,
                        monitor=monitor)
        watch = descriptors.DescriptorWatch(shares, [door, *gateways.values()],
                                            lambda: store.files.held)
        broker.descriptors = watch
        hub.limits["descriptors"] = watch.stats
        hub.limits["topics"] = lambda: {"topics": len(engine.topics), "max_topics": engine.max_topics,
                                        "reclaimed": engine.reclaimed, "unavailable": len(engine.unavailable)}
        hub.limits["input"] = lambda: {"held": budget.total, "input_budget": budget.limit}
        segment.when_out_of_descriptors = watch.out_of_descriptors
        log.info("mc0 broker listening on %s (CURVE %s)", endpoint, "on" if config.curve else "OFF")
        for name in gateways:
            log.info("%s gateway listening on %s:%d", name, *broker.gateway_address(name))
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            # Always handled, so a SIGHUP meant for reloading never kills a broker that has nothing to reload.
            if authenticator is not None:
                loop.add_signal_handler(
                    signal.SIGHUP, auth.reload, authenticator, config.keys_dir, config.allow_any_client
                )
            elif allowed is not None:
                loop.add_signal_handler(signal.SIGHUP, allowed.reload)
            elif config.curve:
                loop.add_signal_handler(signal.SIGHUP, log.info, "SIGHUP: any CURVE client is admitted, "
                                        "nothing to reload")
            else:
                loop.add_signal_handler(signal.SIGHUP, log.info, "SIGHUP: CURVE is off, nothing to reload")
        if monitor is not None:
            monitor.attach(broker)
        if on_ready is not None:
            on_ready(broker)
        async with asyncio.TaskGroup() as group:
            tasks = {group.create_task(router.run(), name="mc0-router"),
                     group.create_task(hub.run(), name="hub")}
            if handshakes is not None:
                tasks.add(group.create_task(handshakes.run(), name="mc0-handshakes"))
            # Not among the tasks whose end stops the broker: with no descriptor listing it ends at once.
            watching = group.create_task(watch.run(), name="descriptors")
            tasks |= {group.create_task(gateway.run(), name=f"{name}-gateway")
                      for name, gateway in gateways.items()}
            if cluster is not None:
                tasks.add(group.create_task(cluster.run(), name="cluster"))
            stopper = group.create_task(broker.stop_event.wait(), name="stop")
            await asyncio.wait({*tasks, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if cluster is not None and stopper.done() and not any(task.done() for task in tasks):
                # Asked to stop: a leader hands the cluster over first, its doors still serving meanwhile
                # (followers fetch, held OKs go out, its clients are sent to the new leader).
                await cluster.hand_over()
            for task in (*tasks, stopper, watching):
                task.cancel()
        log.info("mc0 broker stopped")
    finally:
        if monitor is not None:
            monitor.detach()  # before the logs close: nothing reads them any more
        if watch is not None:
            if segment.when_out_of_descriptors == watch.out_of_descriptors:
                segment.when_out_of_descriptors = None  # one broker per process; tests run several
            watch.close()
        hub.close()
        for gateway in gateways.values():
            gateway.close()
        try:
            engine.close()  # every log written and fsynced, whatever its sync level
        except SyncFailed:
            raise
        except StoreError as error:  # said in the log, topic by topic: the rest was closed all the same
            log.error("some logs could not be closed cleanly: %s", error)
        finally:
            if authenticator is not None:
                authenticator.stop()
            if handshakes is not None:
                handshakes.close()
            socket.close(linger=0)
            if door is not None:
                door.close()
            elif listener is not None:  # the start failed before the native engine took it
                listener.close()
            context.term()


def loop_factory(choice: str = "auto") -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes the broker's event loop: uvloop for ``auto`` where it is installed (its reader callbacks and
    transports cost less per wake-up, see docs/benchmarks.md), else asyncio's own loop."""
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise ConfigError("event_loop is 'uvloop' but uvloop is not installed: pip install uvloop, "
                                  "or set event_loop = 'auto'") from None
            return asyncio.new_event_loop
        return uvloop.new_event_loop
    return asyncio.new_event_loop


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

    with asyncio.Runner(loop_factory=loop_factory(config.event_loop)) as runner:
        runner.run(main())
