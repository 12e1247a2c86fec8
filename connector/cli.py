"""The ``mc0`` command: run the broker, publish, subscribe (with replay, credit and acks), declare and delete
topics, manage keys, show stats and the topics table, and check or mend a data directory offline.

Errors are one clear line and a non-zero exit, never a traceback: every failure the library reports by
exception (:class:`ConnectorError`, key files, configuration, sockets) becomes a ``click.ClickException``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click
import zmq

from broker.topics import MIN_SEGMENT_BYTES
from connector.client import DEFAULT_ENDPOINT, Client, Confirmation
from connector.core import REPLAY_WORDS, ConnectorError, Message
from connector.keys import KeyFileError
from connector.lumberjack_client import DEFAULT_PORT as LUMBERJACK_PORT
from connector.msgq_client import DEFAULT_PORT as MSGQ_PORT
from connector.rstreams_client import DEFAULT_PORT as RSTREAMS_PORT
from connector.sexp_client import DEFAULT_PORT as SEXP_PORT

#: ``mc0 sub`` heartbeats at half this and the broker drops it after 1.05 x this of silence: a killed
#: subscriber leaves the topics' subscriber counts within about 5 s (the library's default is 30 s).
SUBSCRIBER_TTL_MS = 5_000
#: Runs at least this long get a progress bar on stderr.
PROGRESS_FROM = 10_000


class _Group(click.Group):
    """Turns the library's exceptions into one-line errors."""

    def invoke(self, ctx: click.Context) -> Any:
        from broker.config import ConfigError  # the broker is optional for client-only commands
        from broker.store import StoreError

        try:
            return super().invoke(ctx)
        except (ConnectorError, KeyFileError, ConfigError) as error:
            raise click.ClickException(str(error)) from None
        except StoreError as error:  # at start: a corrupt sealed segment, a data directory in use
            raise click.ClickException(f"store: {error}") from None
        except zmq.ZMQError as error:
            raise click.ClickException(f"ZeroMQ: {error}") from None
        except BrokenPipeError:
            # The reader went away (`mc0 stats | head -1`): what it wanted was written. Stop quietly, and keep
            # Python from reporting the same pipe once more when it flushes stdout at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(0) from None
        except OSError as error:
            where = f"{error.filename}: " if error.filename else ""
            raise click.ClickException(f"{where}{error.strerror}") from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mc0")
def main() -> None:
    """mc0: a message broker with one topic engine behind several wire dialects."""


def _client_options(func: Any) -> Any:
    func = click.option("--no-curve", is_flag=True,
                        help="Plaintext (only against a broker run with --no-curve).")(func)
    func = click.option("--keys", "keys_dir", default="keys", envvar="MC0_KEYS", show_envvar=True,
                        show_default=True, type=click.Path(path_type=Path),
                        help="Folder with broker.key and client.key_secret.")(func)
    func = click.option("--broker", "endpoint", default=DEFAULT_ENDPOINT, envvar="MC0_BROKER",
                        show_envvar=True, show_default=True,
                        help="The broker's mc0 address: tcp://HOST:PORT, HOST:PORT or a port; a cluster's "
                             "members separated by commas (the client follows the leader).")(func)
    return func


def _connect(endpoint: str, keys_dir: Path, no_curve: bool, **options: Any) -> Client:
    if no_curve:
        return Client(endpoint, curve=False, **options)
    return Client(endpoint, keys=keys_dir, **options)


# ----------------------------------------------------------------------------------------------------- broker


@main.command()
@click.option("--config", "config_file", type=click.Path(path_type=Path, dir_okay=False),
              help="TOML configuration (optional; defaults are embedded).")
@click.option("--bind", metavar="ADDRESS",
              help="Where the mc0 door listens: tcp://HOST:PORT, HOST:PORT, or a port on every interface "
                   "[default: tcp://*:61616].")
@click.option("--keys", "keys_dir", type=click.Path(path_type=Path), envvar="MC0_KEYS", show_envvar=True,
              help="Keys folder [default: keys].")
@click.option("--data-dir", type=click.Path(path_type=Path, file_okay=False),
              help="Where persistent topics keep their logs [default: mc0-data].")
@click.option("--sexp", metavar="HOST:PORT|off",
              help="sexp gateway address, or off [default: 127.0.0.1:61617].")
@click.option("--msgq", metavar="HOST:PORT|off",
              help="msgq gateway address, or off [default: 127.0.0.1:9912].")
@click.option("--rstreams", metavar="HOST:PORT|off",
              help="reactive-streams gateway address, or off [default: 127.0.0.1:61618].")
@click.option("--lumberjack", metavar="HOST:PORT|off",
              help="Lumberjack gateway address, or off [default: 127.0.0.1:5044].")
@click.option("--http", metavar="HOST:PORT|off",
              help="Monitoring endpoint (metrics, health, dashboard), or off [default: 127.0.0.1:8222, "
                   "if free].")
@click.option("--no-curve", is_flag=True, help="Plaintext, any client admitted: development only.")
@click.option("--allow-any-client", is_flag=True, help="CURVE encryption without the client allow-list.")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="Logging level [default: INFO].")
@click.option("--cluster-node", metavar="HOST:PORT",
              help="This broker's Raft address: it joins a cluster (docs/cluster.md).")
@click.option("--cluster-peer", "cluster_peers", metavar="HOST:PORT", multiple=True,
              help="Another broker's Raft address (once per broker of the cluster).")
@click.option("--advertise", metavar="ADDRESS",
              help="The mc0 address clients and the other brokers reach this broker at (in a cluster).")
def broker(config_file: Path | None, bind: str | None, keys_dir: Path | None, data_dir: Path | None,
           sexp: str | None, msgq: str | None, rstreams: str | None, lumberjack: str | None,
           http: str | None, no_curve: bool, allow_any_client: bool, log_level: str | None,
           cluster_node: str | None, cluster_peers: tuple[str, ...], advertise: str | None) -> None:
    """Run the broker until SIGINT or SIGTERM."""
    from broker import config as broker_config
    from broker import server

    config = broker_config.load(config_file).replace(
        bind=broker_config.bind_endpoint(bind, "--bind") if bind else None, keys_dir=keys_dir,
        data_dir=data_dir, log_level=log_level.upper() if log_level else None,
        curve=False if no_curve else None, allow_any_client=True if allow_any_client else None, sexp=sexp,
        msgq=msgq, rstreams=rstreams, lumberjack=lumberjack, http=http,
        cluster_node=broker_config.raft_address(cluster_node, "--cluster-node") if cluster_node else None,
        cluster_peers=tuple(broker_config.raft_address(peer, "--cluster-peer") for peer in cluster_peers)
        or None,
        advertise=broker_config.bind_endpoint(advertise, "--advertise") if advertise else None,
    )
    broker_config.check_cluster(config)
    for name in broker_config.GATEWAYS:
        config.gateway_address(name)  # a malformed address is a one-line error before anything starts
    config.http_address  # noqa: B018 - likewise
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not config.curve:
        click.secho("WARNING: CURVE is off. Traffic is plaintext and any client may connect.", fg="red",
                    bold=True, err=True)
    created = server.ensure_keys(config)
    if created:
        keys = config.keys_dir
        click.echo(f"Created CURVE keys in {keys}/:", err=True)
        for path in created:
            click.echo(f"  {path}", err=True)
        click.echo(
            f"Clients pin {keys}/broker.key and use a key pair whose public half is in {keys}/allowed/.\n"
            f"The default client pair is {keys}/client.key_secret: `mc0 sub TOPIC --keys {keys}` uses it;\n"
            f"in Python: Client(endpoint, keys={str(keys)!r}).",
            err=True,
        )

    # Where it listens is logged by the broker itself (once, with a timestamp): nothing to add here.
    server.run(config)


# ------------------------------------------------------------------------------------------------ pub and sub


def _parse_headers(pairs: tuple[str, ...]) -> dict[str, str]:
    headers = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            # A ClickException, not BadParameter: the module's promise is one line, without the usage block.
            raise click.ClickException(f"invalid --header {pair!r}: expected K=V")
        headers[key] = value
    return headers


def _stdin_lines() -> Iterator[bytes]:
    for line in click.get_binary_stream("stdin"):
        yield line.rstrip(b"\r\n")


def _repeat_options(func: Any) -> Any:
    """``--count`` and ``--rate``, the load-generating options every ``pub`` command shares."""
    func = click.option("--rate", type=click.FloatRange(min=0), default=0,
                        help="Messages per second (0 = as fast as possible).")(func)
    return click.option("--count", "-n", type=click.IntRange(min=1), default=1, show_default=True,
                        help="Publish MESSAGE this many times (load generation).")(func)


def _publish_each(publish: Callable[[bytes], object], message: str | None, count: int, rate: float,
                  label: str) -> int:
    """``publish`` MESSAGE ``count`` times, or each line of stdin once when there is no MESSAGE, ``rate`` a
    second at most (0: no limit), with a progress bar for long runs; returns how many."""
    _check_repeat(message, count)
    if message is None:
        if click.get_binary_stream("stdin").isatty():
            click.echo("publishing each line typed here; Ctrl-D ends", err=True)
        bodies: Iterable[bytes] = _stdin_lines()
        total = 0
    else:
        bodies = itertools.repeat(message.encode(), count)
        total = count
    interval = 1.0 / rate if rate else 0.0
    start = time.monotonic()
    sent = 0
    with click.progressbar(length=total, label=label, file=sys.stderr, hidden=total < PROGRESS_FROM) as bar:
        for body in bodies:
            if interval:
                delay = start + sent * interval - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            publish(body)
            sent += 1
            if sent % 1000 == 0:
                bar.update(1000)
        bar.update(sent % 1000)
    return sent


def _check_repeat(message: str | None, count: int) -> None:
    """Refuse ``--count`` without MESSAGE, before anything connects."""
    if message is None and count != 1:
        raise click.ClickException("--count repeats MESSAGE: give one (pub TOPIC MESSAGE --count N); without "
                                   "it, each line of stdin is published once")


def _published(sent: int, what: str, start: float) -> None:
    """The one line every ``pub`` ends with (on stderr), with the rate for long runs."""
    line = f"published {sent} {what}"
    if sent >= PROGRESS_FROM:
        elapsed = time.monotonic() - start
        line += f" in {elapsed:.2f}s ({sent / elapsed:,.0f}/s)"
    click.echo(line, err=True)


@main.command()
@click.argument("topic")
@click.argument("message", required=False)
@_client_options
@click.option("--header", "-H", "header_pairs", multiple=True, metavar="K=V", help="Header (repeatable).")
@_repeat_options
@click.option("--confirm", is_flag=True,
              help="Have the broker confirm every message (pipelined: up to 1,024 in flight); exits 1 if it "
                   "refused any.")
def pub(topic: str, message: str | None, endpoint: str, keys_dir: Path, no_curve: bool,
        header_pairs: tuple[str, ...], count: int, rate: float, confirm: bool) -> None:
    """Publish MESSAGE to TOPIC (COUNT times), or each line of stdin when MESSAGE is omitted."""
    _check_repeat(message, count)
    headers = _parse_headers(header_pairs)
    with _connect(endpoint, keys_dir, no_curve) as client:
        confirmations = _Confirmations(client.timeout) if confirm else None

        def publish(body: bytes) -> None:
            if confirmations is None:
                client.publish(topic, body, headers)
            else:
                confirmations.add(client.publish_async(topic, body, headers))

        start = time.monotonic()
        sent = _publish_each(publish, message, count, rate, f"publishing to {topic}")
        client.flush()
        _published(sent, f"message(s) to {topic}", start)
        _report(confirmations)


class _Confirmations:
    """``pub --confirm``: the futures of the messages in flight, settled in order as they resolve, counting
    what the broker confirmed and keeping the first refusal. Memory stays bounded by the client's
    ``max_confirms``: settled futures are let go at once."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.waiting: deque[Confirmation] = deque()
        self.confirmed = 0
        self.refused = 0
        self.first_refusal = ""
        self.last: dict[str, str] = {}

    def add(self, future: Confirmation) -> None:
        self.waiting.append(future)
        while self.waiting and self.waiting[0].done():
            self._settle(self.waiting.popleft())

    def finish(self) -> None:
        while self.waiting:
            future = self.waiting.popleft()
            # Waits for it; _settle counts the outcome (a timeout as a refusal: nothing confirmed it).
            with contextlib.suppress(ConnectorError, TimeoutError):
                future.result(self.timeout)
            self._settle(future)

    def _settle(self, future: Confirmation) -> None:
        error = future.exception() if future.done() else ConnectorError("no confirmation in time")
        if error is None:
            self.confirmed += 1
            self.last = future.result()
        else:
            self.refused += 1
            self.first_refusal = self.first_refusal or str(error)


def _report(confirmations: _Confirmations | None) -> None:
    """With --confirm: what the broker confirmed (on stderr, like the other reports); exit 1 on a refusal."""
    if confirmations is None:
        return
    confirmations.finish()
    last = confirmations.last
    if last:
        what = "" if confirmations.confirmed == 1 else f" {confirmations.confirmed} messages, last"
        durability = last.get("DURABILITY", "-")
        click.echo(f"confirmed:{what} message id {last['MESSAGE-ID']}, durability {durability}", err=True)
    if confirmations.refused:
        raise click.ClickException(f"{confirmations.refused} message(s) not confirmed; the first: "
                                   f"{confirmations.first_refusal}")


class _Replay(click.ParamType):
    """``--replay``: beginning, current or a message id (a non-negative integer)."""

    name = "beginning|current|ID"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str | int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in REPLAY_WORDS:
            return text
        if text.isascii() and text.isdigit():
            return int(text)
        self.fail(f"{value!r} is not 'beginning', 'current' or a message id", param, ctx)


def _as_text(message: Message) -> str:
    return message.text


def _as_json(message: Message) -> str:
    return json.dumps({
        "topic": message.topic, "id": message.id, "timestamp": message.timestamp, "headers": message.headers,
        "body": message.body.decode("utf-8", "replace"),
    })


@main.command()
@click.argument("topics", nargs=-1, required=True)
@_client_options
@click.option("--count", "-n", type=click.IntRange(min=1), help="Exit after N messages.")
@click.option("--timeout", type=click.FloatRange(min=0),
              help="Exit after this many seconds without a message.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message, with id and headers.")
@click.option("--replay", type=_Replay(), metavar="beginning|current|ID",
              help="Start in the log of a persistent topic: from the beginning, the current end, or an id.")
@click.option("--credit", type=click.IntRange(min=1), help="At most N messages in flight to this subscriber.")
@click.option("--ack", "explicit_acks", is_flag=True,
              help="Explicit acks: each message is acked once printed (a queue redelivers the rest).")
def sub(topics: tuple[str, ...], endpoint: str, keys_dir: Path, no_curve: bool, count: int | None,
        timeout: float | None, as_json: bool, replay: str | int | None, credit: int | None,
        explicit_acks: bool) -> None:
    """Print the messages published to TOPICS, one per line."""
    with _connect(endpoint, keys_dir, no_curve, ttl=SUBSCRIBER_TTL_MS) as client:
        client.subscribe(*topics, replay=replay, credit=credit, explicit_acks=explicit_acks)
        # Acked after it is printed: a message this process dies holding goes to another consumer.
        _print_each(_ConnectionReport(client, timeout).receive, _as_json if as_json else _as_text, count,
                    client.ack if explicit_acks else None)


class _ConnectionReport:
    """``mc0 sub``'s receive: the next message (None after ``timeout`` seconds of silence), saying on stderr
    when the broker is lost and why, and when the client is back with its subscriptions restored."""

    #: How often a waiting receive looks up from the inbox to report on the connection.
    LOOK_EVERY = 0.25

    def __init__(self, client: Client, timeout: float | None) -> None:
        self.client = client
        self.timeout = timeout
        self.reconnects = client.reconnects
        self.problem: str | None = None

    def receive(self) -> Message | None:
        client = self.client
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            wait = self.LOOK_EVERY if deadline is None else min(self.LOOK_EVERY, deadline - time.monotonic())
            message = client.receive(timeout=max(0.0, wait))
            self.report()
            if message is not None or (deadline is not None and time.monotonic() >= deadline):
                return message

    def report(self) -> None:
        client = self.client
        if client.connection_problem and client.connection_problem != self.problem:
            click.echo(f"lost the broker: {client.connection_problem}; retrying", err=True)
        self.problem = client.connection_problem
        if client.reconnects != self.reconnects:
            self.reconnects = client.reconnects
            click.echo(f"reconnected to {client.endpoint}: subscriptions restored", err=True)


T = TypeVar("T")


def _print_each(receive: Callable[[], T | None], render: Callable[[T], str], count: int | None,
                after: Callable[[T], object] | None = None) -> None:
    """Print ``render(item)`` for each item ``receive()`` gives until it gives None, ``count`` items were
    printed, or Ctrl-C; ``after(item)`` runs once the line is out."""
    out = click.get_text_stream("stdout")
    printed = 0
    try:
        while count is None or printed < count:
            item = receive()
            if item is None:
                break
            out.write(render(item) + "\n")
            out.flush()
            if after is not None:
                after(item)
            printed += 1
    except KeyboardInterrupt:
        pass


# -------------------------------------------------------------------------------------------- sexp dialect


class _Address(click.ParamType):
    """``--broker`` of a TCP dialect: HOST:PORT."""

    name = "HOST:PORT"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, int]:
        if isinstance(value, tuple):
            return value
        from broker.config import ConfigError, listen_address

        try:
            address = listen_address(str(value), "--broker")
        except ConfigError:
            address = None
        if address is None:  # "off" is a broker setting, not an address to reach
            self.fail(f"{value!r} is not HOST:PORT", param, ctx)
        return address


def _gateway_option(port: int, door: str, envvar: str) -> Callable[[Any], Any]:
    """``--broker HOST:PORT`` of a TCP door, defaulting to its loopback port (or ``envvar``)."""
    return click.option("--broker", "address", type=_Address(), default=f"127.0.0.1:{port}", envvar=envvar,
                        show_envvar=True, show_default=True,
                        help=f"The broker's {door} door: HOST:PORT, tcp://HOST:PORT or a port.")


_sexp_options = _gateway_option(SEXP_PORT, "sexp", "MC0_SEXP")


@main.group()
def sexp() -> None:
    """Publish and subscribe through the sexp dialect."""


@sexp.command("sub")
@click.argument("topics", nargs=-1, required=True)
@_sexp_options
@click.option("--replay", type=_Replay(), metavar="beginning|current|ID", default="current",
              show_default=True, help="Where to start: From_beginning, From_current or (From_message ID).")
@click.option("--count", "-n", type=click.IntRange(min=1), help="Exit after N messages.")
@click.option("--timeout", type=click.FloatRange(min=0),
              help="Exit after this many seconds without a message.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message, with ids.")
def sexp_sub(topics: tuple[str, ...], address: tuple[str, int], replay: str | int, count: int | None,
             timeout: float | None, as_json: bool) -> None:
    """Print the messages published to TOPICS, received over the sexp dialect."""
    from connector.sexp_client import SexpClient, SexpMessage

    def render(message: SexpMessage) -> str:
        if as_json:
            return json.dumps({"topic": message.topic.decode("utf-8", "replace"),
                               "topic_id": message.topic_id, "id": message.id,
                               "body": message.body.decode("utf-8", "replace")})
        return message.body.decode("utf-8", "replace")

    with SexpClient(*address, client_id="mc0-cli") as client:
        for topic in topics:
            client.subscribe(topic, replay=replay)
        _print_each(lambda: client.receive(timeout=timeout), render, count)


@sexp.command("pub")
@click.argument("topic")
@click.argument("message", required=False)
@_sexp_options
@_repeat_options
def sexp_pub(topic: str, message: str | None, address: tuple[str, int], count: int, rate: float) -> None:
    """Publish MESSAGE (COUNT times, or each line of stdin) to TOPIC with the sexp dialect's Publish
    extension. The dialect carries no headers."""
    from connector.sexp_client import SexpClient

    _check_repeat(message, count)
    with SexpClient(*address, client_id="mc0-cli") as client:
        start = time.monotonic()
        sent = _publish_each(lambda body: client.publish(topic, body), message, count, rate,
                             f"publishing to {topic}")
        # Publish has no acknowledgement in this dialect; closing waits until the broker has read it all.
    _published(sent, f"message(s) to {topic}", start)


# -------------------------------------------------------------------------------------------- msgq dialect


_msgq_options = _gateway_option(MSGQ_PORT, "msgq", "MC0_MSGQ")


def _item_json(item: Any) -> Any:
    """A msgq item as JSON: DATA as text, HASH as an object, LIST as an array, NULL as null."""
    if isinstance(item, bytes):
        return item.decode("utf-8", "replace")
    if isinstance(item, dict):
        return {key.decode("utf-8", "replace"): _item_json(value) for key, value in item.items()}
    if isinstance(item, list):
        return [_item_json(value) for value in item]
    return None


@main.group()
def msgq() -> None:
    """Send and subscribe through the msgq dialect."""


@msgq.command("sub")
@click.argument("groups", nargs=-1, required=True)
@_msgq_options
@click.option("--instance", default="*", show_default=True, help="Only this instance of the groups.")
@click.option("--subtype", type=click.Choice(["normal", "meonly", "promisc"]), default="normal",
              show_default=True,
              help="normal: sends to everyone; meonly: sends to this connection; promisc: all.")
@click.option("--replay", type=_Replay(), metavar="beginning|current|ID",
              help="Start in the log of a persistent group (our subscribe extension).")
@click.option("--count", "-n", type=click.IntRange(min=1), help="Exit after N messages.")
@click.option("--timeout", type=click.FloatRange(min=0),
              help="Exit after this many seconds without a message.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per send, with every routing field.")
def msgq_sub(groups: tuple[str, ...], address: tuple[str, int], instance: str, subtype: str,
             replay: str | int | None, count: int | None, timeout: float | None, as_json: bool) -> None:
    """Print the messages sent to GROUPS, received over the msgq dialect."""
    from connector.msgq_client import MsgqClient

    def render(send: Any) -> str:
        if as_json:
            fields = {"from": send.sender, "to": send.to, "group": send.group, "instance": send.instance,
                      "seq": send.seq, "repl": send.repl, "body": send.msg}
            shown = {name: _item_json(value) for name, value in fields.items()}
            shown.update({name.decode("utf-8", "replace"): _item_json(value)
                          for name, value in send.extra.items()})
            return json.dumps(shown)
        if isinstance(send.msg, bytes):
            return send.msg.decode("utf-8", "replace")
        return json.dumps(_item_json(send.msg))

    with MsgqClient(*address) as client:
        for group in groups:
            client.subscribe(group, instance=instance, subtype=subtype, replay=replay)
        _print_each(lambda: client.receive(timeout=timeout), render, count)


@msgq.command("pub")
@click.argument("group")
@click.argument("message", required=False)
@_msgq_options
@click.option("--instance", default="*", show_default=True, help="The instance the message is for.")
@click.option("--to", default="*", show_default=True, help="One connection's local name, or * for everyone.")
@click.option("--header", "-H", "header_pairs", multiple=True, metavar="X-K=V",
              help="An X- field of the send, an mc0 header on other doors (repeatable).")
@_repeat_options
def msgq_pub(group: str, message: str | None, address: tuple[str, int], instance: str, to: str,
             header_pairs: tuple[str, ...], count: int, rate: float) -> None:
    """Send MESSAGE (COUNT times, or each line of stdin) to GROUP as a msgq send."""
    from connector.msgq_client import MsgqClient

    _check_repeat(message, count)
    fields = {key.encode(): value.encode() for key, value in _parse_headers(header_pairs).items()}
    not_x = sorted(key.decode() for key in fields if not key.startswith(b"X-"))
    if not_x:
        raise click.ClickException(f"--header {not_x[0]}: msgq carries X- fields only as headers "
                                   f"(X-{not_x[0]})")
    with MsgqClient(*address) as client:
        start = time.monotonic()
        sent = _publish_each(lambda body: client.send(group, body, instance=instance, to=to, fields=fields),
                             message, count, rate, f"sending to {group}")
        client.stats()  # the reply comes after every send was taken
    _published(sent, f"message(s) to {group} as {client.lname.decode()}", start)


@msgq.command("stats")
@_msgq_options
def msgq_stats(address: tuple[str, int]) -> None:
    """Print the msgq gateway's stats reply."""
    from connector.msgq_client import MsgqClient

    with MsgqClient(*address) as client:
        counters = client.stats()
    click.echo(json.dumps(_item_json(counters), indent=2, sort_keys=True))


# ----------------------------------------------------------------------------------- reactive-streams dialect


_rstreams_options = _gateway_option(RSTREAMS_PORT, "reactive-streams", "MC0_RSTREAMS")


@main.group()
def rstreams() -> None:
    """Subscribe with demand, and publish, through the reactive-streams dialect."""


@rstreams.command("sub")
@click.argument("topic")
@_rstreams_options
@click.option("--demand", type=click.IntRange(min=1), default=100, show_default=True,
              help="Elements requested at a time: N first, N more each time N have arrived.")
@click.option("--replay", type=_Replay(), metavar="beginning|current|ID",
              help="Start in the log of a persistent topic.")
@click.option("--count", "-n", type=click.IntRange(min=1), help="Exit after N elements.")
@click.option("--timeout", type=click.FloatRange(min=0),
              help="Exit after this many seconds without an element.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per element, with its message id.")
def rstreams_sub(topic: str, address: tuple[str, int], demand: int, replay: str | int | None,
                 count: int | None, timeout: float | None, as_json: bool) -> None:
    """Print the elements of TOPIC, requesting them DEMAND at a time."""
    from connector.rstreams_client import Element, RStreamsClient

    with RStreamsClient(*address) as client:
        stream = client.subscribe(topic, demand=demand, replay=replay, ids=True)
        arrived = 0

        def render(element: Element) -> str:
            if as_json:
                return json.dumps({"topic": element.topic.decode("utf-8", "replace"), "id": element.id,
                                   "body": element.data.decode("utf-8", "replace")})
            return element.data.decode("utf-8", "replace")

        def more(_: Element) -> None:
            nonlocal arrived
            arrived += 1
            if arrived % demand == 0:
                client.request(stream, demand)

        _print_each(lambda: client.receive(timeout=timeout), render, count, more)


@rstreams.command("pub")
@click.argument("topic")
@click.argument("message", required=False)
@_rstreams_options
@_repeat_options
def rstreams_pub(
    topic: str, message: str | None, address: tuple[str, int], count: int, rate: float
) -> None:
    """Publish MESSAGE (COUNT times, or each line of stdin) to TOPIC by offering a publisher; every element
    waits for the broker's demand. The dialect carries no headers."""
    from connector.rstreams_client import RStreamsClient

    _check_repeat(message, count)
    with RStreamsClient(*address) as client:
        client.offer(topic)
        start = time.monotonic()
        sent = _publish_each(lambda body: client.publish(topic, body), message, count, rate,
                             f"publishing to {topic}")
    _published(sent, f"element(s) to {topic}", start)


# ------------------------------------------------------------------------------------------------ lumberjack


@main.group()
def lumberjack() -> None:
    """Ship log lines into the broker over Lumberjack, the Beats protocol."""


@lumberjack.command("ship")
@click.argument("source", type=click.File("rb"), default="-")
@_gateway_option(LUMBERJACK_PORT, "Lumberjack", "MC0_LUMBERJACK")
@click.option("--batch", type=click.IntRange(min=1), default=2048, show_default=True,
              help="Events per window at most; each batch waits for the broker's ack.")
@click.option("--idle", type=click.FloatRange(min=0.01, max=1.0), default=0.2, show_default=True,
              help="Seconds without a new line after which the lines read so far leave as a batch.")
@click.option("--field", "-f", "field_pairs", multiple=True, metavar="K=V",
              help="A field added to every event (repeatable), e.g. -f host=web1.")
@click.option("--protocol", "version", type=click.Choice(["1", "2"]), default="2", show_default=True,
              help="1: string maps (logstash-forwarder); 2: JSON (Beats).")
@click.option("--no-compress", is_flag=True, help="Plain frames instead of one compressed frame per batch.")
@click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False),
              help="Verify the broker against this CA.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="Client certificate (PEM).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="Client certificate key (PEM).")
def lumberjack_ship(source: Any, address: tuple[str, int], batch: int, idle: float,
                    field_pairs: tuple[str, ...], version: str, no_compress: bool, tls_ca: str | None,
                    tls_cert: str | None, tls_key: str | None) -> None:
    """Ship each line of SOURCE (a file, or - for stdin) as an event {"message": line, ...fields}.

    Lines leave as they come (tail -f works): a batch goes when it is full or when no line came for --idle
    seconds. Ctrl-C ships what was read, waits for the broker's ack and exits (a second Ctrl-C does not
    wait)."""
    import ssl

    from connector.lumberjack_client import LumberjackClient

    extra = {key: value for key, value in (pair.partition("=")[::2] for pair in field_pairs)}
    tls = None
    if tls_ca or tls_cert:
        tls = ssl.create_default_context(cafile=tls_ca)
        if tls_cert:
            tls.load_cert_chain(tls_cert, tls_key)
    lines = _LineBatches(source, batch, idle)
    with lines.stop_on_interrupt(), LumberjackClient(*address, version=int(version), tls=tls) as client:
        events = ([{"message": line.rstrip(b"\r\n").decode("utf-8", "replace"), **extra} for line in chunk]
                  for chunk in lines)
        shipped = client.send_batches(events, compress=not no_compress)
    ending = " (interrupted: what was read is shipped)" if lines.interrupted else ""
    click.echo(f"shipped {shipped} event(s), every one acknowledged{ending}", err=True)


class _LineBatches:
    """The lines of a stream in batches: one leaves when ``size`` lines are read or when none came for
    ``idle`` seconds, so a ``tail -f`` is shipped as it grows. A thread reads (a pipe has no read timeout),
    into a bounded queue: a slow broker holds the reading back, never memory."""

    _END = b""  # a line always ends with a newline or has text: an empty item marks the end of the stream

    def __init__(self, source: Any, size: int, idle: float) -> None:
        self.size = size
        self.idle = idle
        self.lines: queue.Queue[bytes] = queue.Queue(maxsize=2 * size)
        self.stopping = threading.Event()
        self.interrupted = False
        threading.Thread(target=self._read, args=(source,), name="mc0-ship-reader", daemon=True).start()

    def _read(self, source: Any) -> None:
        try:
            for line in source:
                if line:
                    self.lines.put(line)
        finally:
            self.lines.put(self._END)

    def __iter__(self) -> Iterator[list[bytes]]:
        chunk: list[bytes] = []
        deadline: float | None = None
        while True:
            wait = 0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic()))
            try:
                line = self.lines.get(timeout=wait)
            except queue.Empty:
                line = None
            if line == self._END or (line is None and self.stopping.is_set()):
                if chunk:
                    yield chunk
                return
            if line is not None:
                chunk.append(line)
                deadline = deadline or time.monotonic() + self.idle
            if chunk and (len(chunk) >= self.size or time.monotonic() >= (deadline or 0)):
                yield chunk
                chunk = []
                deadline = None

    @contextlib.contextmanager
    def stop_on_interrupt(self) -> Iterator[None]:
        """While shipping, the first SIGINT stops reading (what was read still leaves and is acknowledged);
        the second is Python's usual KeyboardInterrupt."""

        def interrupted(signum: int, frame: Any) -> None:
            self.interrupted = True
            self.stopping.set()
            signal.signal(signal.SIGINT, previous)

        try:
            previous = signal.signal(signal.SIGINT, interrupted)
        except ValueError:  # not the main thread (a test's runner): no handler to install
            yield
            return
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)


# ----------------------------------------------------------------------------------------- declare, topics


@main.command()
@click.argument("topic")
@_client_options
@click.option("--delivery", type=click.Choice(["broadcast", "round-robin"]),
              help="Every subscriber gets every message, or each message goes to one (a queue).")
@click.option("--persistence", type=click.Choice(["transient", "persistent"]),
              help="Memory only, or written to the broker's log.")
@click.option("--sync", type=click.Choice(["strong", "weak", "async"]),
              help="Persistent topics: fsync before the OK, written before delivery, or no flush promise.")
@click.option("--retention-bytes", type=click.IntRange(min=1), metavar="N",
              help="Persistent topics: delete the oldest segments beyond N bytes.")
@click.option("--retention-seconds", type=click.FloatRange(min=0, min_open=True), metavar="S",
              help="Persistent topics: delete segments older than S seconds.")
@click.option("--segment-bytes", type=click.IntRange(min=MIN_SEGMENT_BYTES), metavar="N",
              help=f"Persistent topics: seal a segment file at N bytes (at least {MIN_SEGMENT_BYTES}).")
@click.option("--max-backlog", type=click.IntRange(min=0), metavar="N",
              help="Transient round-robin topics: messages held while no consumer has room.")
@click.option("--element-size", type=click.IntRange(min=1), metavar="N",
              help="Every message exactly N bytes (reactive-streams subscribers get them packed).")
def declare(topic: str, endpoint: str, keys_dir: Path, no_curve: bool, **settings: Any) -> None:
    """Create TOPIC with these settings (the same settings again are fine, others are refused)."""
    given = {name: value for name, value in settings.items() if value is not None}
    with _connect(endpoint, keys_dir, no_curve, ttl=None) as client:
        client.declare(topic, **given)
    shown = ", ".join(f"{name.replace('_', '-')}={value:g}" if isinstance(value, float)
                      else f"{name.replace('_', '-')}={value}" for name, value in given.items())
    click.echo(f"declared {topic}" + (f" ({shown})" if shown else " (broker defaults)"))


#: ``mc0 topics`` columns: heading, and whether the column holds numbers (right-aligned).
#: "published" counts every message a topic took since the broker started; "stored", "first" and "bytes" are
#: its log's (a transient topic has none: "-"); "last" is the newest id given, stored or not.
TOPIC_COLUMNS = (("topic", False), ("delivery", False), ("persistence", False), ("published", True),
                 ("stored", True), ("first", True), ("last", True), ("bytes", True), ("subs", True),
                 ("lag", True), ("dropped", True))


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _topic_row(name: str, topic: dict[str, Any]) -> list[str]:
    """One ``mc0 topics`` row; keys a broker does not send (transient topics have no log) show as "-"."""
    persistence = _cell(topic.get("persistence"))
    if topic.get("sync"):
        persistence += f"/{topic['sync']}"
    stored = topic.get("stored")
    first, last = topic.get("first_id"), topic.get("last_id")
    if stored == 0:
        first = None  # ids start at 1: an empty log has no first id
    if last == 0:
        last = None  # nothing was ever published
    return [name, _cell(topic.get("delivery")), persistence, _cell(topic.get("messages_in")), _cell(stored),
            _cell(first), _cell(last), _cell(topic.get("bytes")), _cell(topic.get("subscribers")),
            _cell(topic.get("lag")), _cell(topic.get("dropped"))]


def _table(rows: list[list[str]]) -> Iterator[str]:
    headings = [heading for heading, _ in TOPIC_COLUMNS]
    widths = [max(len(row[n]) for row in [headings, *rows]) for n in range(len(headings))]
    for row in [headings, *rows]:
        cells = [cell.rjust(width) if numeric else cell.ljust(width)
                 for cell, width, (_, numeric) in zip(row, widths, TOPIC_COLUMNS, strict=True)]
        yield "  ".join(cells).rstrip()


def _page_options(func: Any) -> Any:
    """Which topics: the broker answers a page at a time (at most 1,000 topics)."""
    func = click.option("--after", metavar="TOPIC", help="Only topics after this one (the next page).")(func)
    func = click.option("--limit", type=click.IntRange(min=1), metavar="N",
                        help="At most N topics [default: the broker's page, 1,000].")(func)
    func = click.option("--prefix", default="", metavar="TEXT",
                        help="Only topics whose names start so.")(func)
    return func


def _more(stats: dict[str, Any], shown: int) -> None:
    """On stderr, when the broker has more topics than this page: how many, and how to see the next."""
    following = stats.get("topics_next")
    if following is not None:
        total = stats.get("topics_total", "?")
        click.echo(f"({shown} topics shown of {total}; the next page: --after {following!r})", err=True)


@main.command()
@_client_options
@_page_options
@click.option("--all", "every", is_flag=True, help="Every topic, asking page after page.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw per-topic JSON.")
def topics(endpoint: str, keys_dir: Path, no_curve: bool, prefix: str, limit: int | None, after: str | None,
           every: bool, as_json: bool) -> None:
    """One row per topic: settings, stored messages and their ids, bytes on disk, subscribers, lag, drops."""
    data: dict[str, Any] = {}
    with _connect(endpoint, keys_dir, no_curve, ttl=None) as client:
        while True:
            stats = client.stats(prefix=prefix, after=after, limit=limit)
            data.update(stats.get("topics") or {})
            after = stats.get("topics_next")
            if not every or after is None:
                break
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
    elif not data:
        click.echo("(no topics)")
    else:
        for line in _table([_topic_row(name, topic) for name, topic in sorted(data.items())]):
            click.echo(line)
    if not every:
        _more(stats, len(data))


@main.command()
@click.argument("topic")
@_client_options
def delete(topic: str, endpoint: str, keys_dir: Path, no_curve: bool) -> None:
    """Remove TOPIC, its stored messages and their files (refused while anybody subscribes to it)."""
    with _connect(endpoint, keys_dir, no_curve, ttl=None) as client:
        client.delete(topic)
    click.echo(f"deleted {topic}")


# ---------------------------------------------------------------------------------------- verify and repair


def _data_dir(config_file: Path | None, data_dir: Path | None) -> Path:
    from broker import config as broker_config

    return data_dir if data_dir is not None else broker_config.load(config_file).data_dir


_offline_options = [
    click.option("--config", "config_file", type=click.Path(path_type=Path, dir_okay=False),
                 help="The broker's TOML configuration (for its data_dir)."),
    click.option("--data-dir", type=click.Path(path_type=Path, file_okay=False),
                 help="The data directory [default: the configuration's, mc0-data]."),
]


def _offline(func: Any) -> Any:
    for option in reversed(_offline_options):
        func = option(func)
    return func


def _summary(summary: Any) -> None:
    for line in summary.notes:
        click.echo(f"note: {line}")
    for line in summary.problems:
        click.echo(line)
    problems = f"{len(summary.problems)} damaged" if summary.problems else "no damage"
    click.echo(f"{summary.topics} topics, {summary.segments} segments, {summary.records} records read: "
               f"{problems}")


@main.command()
@_offline
def verify(config_file: Path | None, data_dir: Path | None) -> None:
    """Read every stored record of a data directory and say what is damaged (the broker must be stopped).
    Exits 1 when something is."""
    from broker.store import check

    summary = check.verify(_data_dir(config_file, data_dir))
    _summary(summary)
    if summary.problems:
        click.echo("`mc0 repair` quarantines the damaged segments and keeps every record that reads.",
                   err=True)
        sys.exit(1)


@main.command()
@_offline
def repair(config_file: Path | None, data_dir: Path | None) -> None:
    """Quarantine damaged segments, write back every record that reads, record the ids lost (the broker must
    be stopped)."""
    from broker.store import check

    root = _data_dir(config_file, data_dir)
    summary = check.repair(root)
    _summary(summary)
    for line in summary.repaired:
        click.echo(f"repaired: {line}")
    if not summary.repaired:
        click.echo("nothing to repair")


# ----------------------------------------------------------------------------------------------- keys, stats


@main.group()
def keys() -> None:
    """Manage CURVE certificates."""


@keys.command("generate")
@click.option("--keys", "keys_dir", default="keys", envvar="MC0_KEYS", show_envvar=True, show_default=True,
              type=click.Path(path_type=Path), help="Keys folder.")
@click.option("--client", "clients", multiple=True, metavar="NAME",
              help="Client certificate to create and admit (repeatable) [default: client].")
@click.option("--force", is_flag=True,
              help="Replace existing pairs (clients pinned to the old broker key break).")
def keys_generate(keys_dir: Path, clients: tuple[str, ...], force: bool) -> None:
    """Create the broker key pair and client certificates admitted by the broker."""
    from connector import keys as key_files

    written = key_files.generate(keys_dir, clients or (key_files.CLIENT,), force=force)
    if not written:
        click.echo(f"{keys_dir}: every requested key pair exists already (use --force to replace)")
    for path in written:
        click.echo(f"wrote {path}")


@keys.command("client")
@click.argument("name")
@click.option("--keys", "keys_dir", default="keys", envvar="MC0_KEYS", show_envvar=True, show_default=True,
              type=click.Path(path_type=Path), help="The client's keys folder.")
def keys_client(name: str, keys_dir: Path) -> None:
    """Create a client key pair NAME here, on the client's machine (no broker pair), and say how to admit
    it on the broker."""
    from connector import keys as key_files

    pair = key_files.client(keys_dir, name)
    click.echo(f"wrote {keys_dir}/{name}.key and {keys_dir}/{name}.key_secret")
    click.echo(f"admit it on the broker's machine: {key_files.admit_command(pair.public.decode(), name)}")
    if not (keys_dir / f"{key_files.BROKER}.key").exists():
        click.echo(f"and copy the broker's broker.key into {keys_dir}/ (clients pin it)")


# A Z85 key may start with "-" (1 key in 85): read as the KEY argument, not refused as an unknown option, and
# with no short option here, no letter of it can be read as one ("-h" would have shown the help).
@keys.command("admit", context_settings={"ignore_unknown_options": True, "help_option_names": ["--help"]})
@click.argument("name")
@click.argument("key")
@click.option("--keys", "keys_dir", default="keys", envvar="MC0_KEYS", show_envvar=True, show_default=True,
              type=click.Path(path_type=Path), help="The broker's keys folder.")
def keys_admit(name: str, key: str, keys_dir: Path) -> None:
    """Admit a client: put its public KEY (Z85 text, or its .key file) on the allow-list as NAME.

    Run it beside the broker: a running broker admits the key at its next handshake."""
    from connector import keys as key_files

    path = key_files.admit(keys_dir, name, key_files.public_key(key))
    click.echo(f"wrote {path}: the broker admits this client from its next connection")


@main.command()
@click.option("--http", "address", default="127.0.0.1:8222", envvar="MC0_HTTP", show_envvar=True,
              show_default=True, metavar="HOST:PORT", help="The broker's monitoring endpoint.")
@click.option("--ready", is_flag=True, help="Ask whether it serves (/readyz), not only whether it is alive.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=5.0, show_default=True,
              help="Seconds to wait for the answer.")
def health(address: str, ready: bool, timeout: float) -> None:
    """Ask the broker's monitoring endpoint whether it is healthy; exit 1 if not (for healthchecks).

    Needs no keys: the endpoint is plain HTTP on loopback by default."""
    import urllib.error
    import urllib.request

    from broker.config import listen_address

    where = listen_address(address, "--http")
    if where is None:
        raise click.ClickException("--http off: there is no endpoint to ask")
    host, port = where
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/{'readyz' if ready else 'healthz'}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            status = json.loads(response.read()).get("status", "ok")
    except urllib.error.HTTPError as error:
        try:
            answer = json.loads(error.read())
        except ValueError:
            answer = {}
        reason = answer.get("reason") or answer.get("status") or error.reason
        raise click.ClickException(f"{url}: {error.code}, {reason}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise click.ClickException(f"cannot reach {url}: {reason} (is the broker running, with --http on?)"
                                   ) from None
    click.echo(status)


@main.command()
@_client_options
@_page_options
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
def stats(endpoint: str, keys_dir: Path, no_curve: bool, prefix: str, limit: int | None, after: str | None,
          as_json: bool) -> None:
    """Show the broker's uptime, connections and per-topic counters (a page of topics)."""
    with _connect(endpoint, keys_dir, no_curve, ttl=None) as client:
        data = client.stats(prefix=prefix, after=after, limit=limit)
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    _more(data, len(data["topics"]))
    click.echo(f"uptime       {data['uptime_seconds']:.0f}s")
    click.echo("connections  " + ", ".join(f"{k} {v}" for k, v in data["connections"].items()))
    topics = data["topics"]
    if not topics:
        click.echo("topics       (none)")
        return
    width = max(len(name) for name in topics)
    click.echo(f"{'topic':<{width}}  {'delivery':<11} {'subs':>5} {'in':>10} {'out':>10} {'dropped':>8}")
    for name, topic in sorted(topics.items()):
        click.echo(f"{name:<{width}}  {topic['delivery']:<11} {topic['subscribers']:>5} "
                   f"{topic['messages_in']:>10} {topic['messages_out']:>10} {topic['dropped']:>8}")
