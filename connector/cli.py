"""The ``mc0`` command: run the broker, publish, subscribe (with replay, credit and acks), declare and delete
topics, manage keys, show stats and the topics table, and check or mend a data directory offline.

Errors are one clear line and a non-zero exit, never a traceback: every failure the library reports by
exception (:class:`ConnectorError`, key files, configuration, sockets) becomes a ``click.ClickException``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click
import zmq

from connector.client import DEFAULT_ENDPOINT, Client
from connector.core import REPLAY_WORDS, ConnectorError, Message
from connector.keys import KeyFileError
from connector.lumberjack_client import DEFAULT_PORT as LUMBERJACK_PORT
from connector.msgq_client import DEFAULT_PORT as MSGQ_PORT
from connector.rstreams_client import DEFAULT_PORT as RSTREAMS_PORT
from connector.sexp_client import DEFAULT_PORT as SEXP_PORT

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
    func = click.option("--keys", "keys_dir", default="keys", envvar="MC0_KEYS", show_default=True,
                        type=click.Path(path_type=Path),
                        help="Folder with broker.key and client.key_secret.")(func)
    func = click.option("--broker", "endpoint", default=DEFAULT_ENDPOINT, envvar="MC0_BROKER",
                        show_default=True, help="Broker endpoint.")(func)
    return func


def _connect(endpoint: str, keys_dir: Path, no_curve: bool, **options: Any) -> Client:
    if no_curve:
        return Client(endpoint, curve=False, **options)
    return Client(endpoint, keys=keys_dir, **options)


# ----------------------------------------------------------------------------------------------------- broker


@main.command()
@click.option("--config", "config_file", type=click.Path(path_type=Path, dir_okay=False),
              help="TOML configuration (optional; defaults are embedded).")
@click.option("--bind", help="mc0 ROUTER endpoint [default: tcp://*:61616].")
@click.option("--keys", "keys_dir", type=click.Path(path_type=Path), envvar="MC0_KEYS",
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
@click.option("--no-curve", is_flag=True, help="Plaintext, any client admitted: development only.")
@click.option("--allow-any-client", is_flag=True, help="CURVE encryption without the client allow-list.")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="Logging level [default: INFO].")
def broker(config_file: Path | None, bind: str | None, keys_dir: Path | None, data_dir: Path | None,
           sexp: str | None, msgq: str | None, rstreams: str | None, lumberjack: str | None,
           no_curve: bool, allow_any_client: bool, log_level: str | None) -> None:
    """Run the broker until SIGINT or SIGTERM."""
    from broker import config as broker_config
    from broker import server

    config = broker_config.load(config_file).replace(
        bind=bind, keys_dir=keys_dir, data_dir=data_dir, log_level=log_level.upper() if log_level else None,
        curve=False if no_curve else None, allow_any_client=True if allow_any_client else None, sexp=sexp,
        msgq=msgq, rstreams=rstreams, lumberjack=lumberjack,
    )
    for name in broker_config.GATEWAYS:
        config.gateway_address(name)  # a malformed address is a one-line error before anything starts
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

    def ready(running: server.Broker) -> None:
        click.echo(f"mc0 broker listening on {running.endpoint}", err=True)
        for name in running.gateways:
            host, port = running.gateway_address(name)
            click.echo(f"{name} gateway listening on {host}:{port}", err=True)

    server.run(config, ready)


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


@main.command()
@click.argument("topic")
@click.argument("message", required=False)
@_client_options
@click.option("--header", "-H", "header_pairs", multiple=True, metavar="K=V", help="Header (repeatable).")
@click.option("--count", "-n", type=click.IntRange(min=1), default=1, show_default=True,
              help="Publish MESSAGE this many times (load generation).")
@click.option("--rate", type=click.FloatRange(min=0), default=0,
              help="Messages per second (0 = as fast as possible).")
@click.option("--confirm", is_flag=True, help="Wait for the broker's OK for every message.")
def pub(topic: str, message: str | None, endpoint: str, keys_dir: Path, no_curve: bool,
        header_pairs: tuple[str, ...], count: int, rate: float, confirm: bool) -> None:
    """Publish MESSAGE to TOPIC, or each line of stdin when MESSAGE is omitted."""
    headers = _parse_headers(header_pairs)
    with _connect(endpoint, keys_dir, no_curve) as client:
        confirmed: dict[str, str] | None = None  # the broker's last OK: MESSAGE-ID and DURABILITY
        if message is None:
            sent = 0
            for line in _stdin_lines():
                confirmed = client.publish(topic, line, headers, confirm=confirm)
                sent += 1
            client.flush()
            click.echo(f"published {sent} message(s) to {topic}", err=True)
            _say_confirmed(confirmed)
            return
        body = message.encode()
        interval = 1.0 / rate if rate else 0.0
        start = time.monotonic()
        with click.progressbar(length=count, label=f"publishing to {topic}", file=sys.stderr,
                               hidden=count < PROGRESS_FROM) as bar:
            for n in range(count):
                if interval:
                    delay = start + n * interval - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                confirmed = client.publish(topic, body, headers, confirm=confirm)
                if n % 1000 == 999:
                    bar.update(1000)
            bar.update(count % 1000)
        client.flush()
        if count >= PROGRESS_FROM:
            elapsed = time.monotonic() - start
            click.echo(f"published {count} messages in {elapsed:.2f}s ({count / elapsed:,.0f}/s)", err=True)
        _say_confirmed(confirmed)


def _say_confirmed(reply: dict[str, str] | None) -> None:
    """With --confirm: what the broker's last OK said was achieved (on stderr, like the other reports)."""
    if reply and "MESSAGE-ID" in reply:
        click.echo(f"confirmed: message id {reply['MESSAGE-ID']}, durability {reply.get('DURABILITY', '-')}",
                   err=True)


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
    with _connect(endpoint, keys_dir, no_curve) as client:
        client.subscribe(*topics, replay=replay, credit=credit, explicit_acks=explicit_acks)
        # Acked after it is printed: a message this process dies holding goes to another consumer.
        _print_each(lambda: client.receive(timeout=timeout), _as_json if as_json else _as_text, count,
                    client.ack if explicit_acks else None)


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


def _gateway_option(port: int, door: str) -> Callable[[Any], Any]:
    """``--broker HOST:PORT`` of a TCP door, defaulting to its loopback port."""
    return click.option("--broker", "address", type=_Address(), default=f"127.0.0.1:{port}",
                        show_default=True, help=f"The broker's {door} gateway.")


_sexp_options = _gateway_option(SEXP_PORT, "sexp")


@main.group()
def sexp() -> None:
    """Publish and subscribe through the sexp dialect (seed 000)."""


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
def sexp_pub(topic: str, message: str | None, address: tuple[str, int]) -> None:
    """Publish MESSAGE (or each line of stdin) to TOPIC with the sexp dialect's Publish extension."""
    from connector.sexp_client import SexpClient

    with SexpClient(*address, client_id="mc0-cli") as client:
        bodies = _stdin_lines() if message is None else iter([message.encode()])
        sent = 0
        for body in bodies:
            client.publish(topic, body)
            sent += 1
        # Publish has no acknowledgement in this dialect; closing waits until the broker has read it all.
    click.echo(f"published {sent} message(s) to {topic}", err=True)


# -------------------------------------------------------------------------------------------- msgq dialect


_msgq_options = _gateway_option(MSGQ_PORT, "msgq")


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
    """Send and subscribe through the msgq dialect (seed 003)."""


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
                      "seq": send.seq, "repl": send.repl, "msg": send.msg}
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
def msgq_pub(group: str, message: str | None, address: tuple[str, int], instance: str, to: str) -> None:
    """Send MESSAGE (or each line of stdin) to GROUP as a msgq send."""
    from connector.msgq_client import MsgqClient

    with MsgqClient(*address) as client:
        bodies = _stdin_lines() if message is None else iter([message.encode()])
        sent = 0
        for body in bodies:
            client.send(group, body, instance=instance, to=to)
            sent += 1
        client.stats()  # the reply comes after every send was taken
    click.echo(f"sent {sent} message(s) to {group} as {client.lname.decode()}", err=True)


@msgq.command("stats")
@_msgq_options
def msgq_stats(address: tuple[str, int]) -> None:
    """Print the msgq gateway's stats reply."""
    from connector.msgq_client import MsgqClient

    with MsgqClient(*address) as client:
        counters = client.stats()
    click.echo(json.dumps(_item_json(counters), indent=2, sort_keys=True))


# ----------------------------------------------------------------------------------- reactive-streams dialect


_rstreams_options = _gateway_option(RSTREAMS_PORT, "reactive-streams")


@main.group()
def rstreams() -> None:
    """Subscribe with demand, and publish, through the reactive-streams dialect (seed 001)."""


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
                                   "data": element.data.decode("utf-8", "replace")})
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
def rstreams_pub(topic: str, message: str | None, address: tuple[str, int]) -> None:
    """Publish MESSAGE (or each line of stdin) to TOPIC by offering a publisher; every element waits for
    the broker's demand."""
    from connector.rstreams_client import RStreamsClient

    with RStreamsClient(*address) as client:
        client.offer(topic)
        sent = 0
        for body in (_stdin_lines() if message is None else iter([message.encode()])):
            client.publish(topic, body)
            sent += 1
    click.echo(f"published {sent} element(s) to {topic}", err=True)


# ------------------------------------------------------------------------------------------------ lumberjack


@main.group()
def lumberjack() -> None:
    """Ship log lines into the broker over Lumberjack, the Beats protocol (seed 004)."""


@lumberjack.command("ship")
@click.argument("source", type=click.File("rb"), default="-")
@_gateway_option(LUMBERJACK_PORT, "Lumberjack")
@click.option("--batch", type=click.IntRange(min=1), default=2048, show_default=True,
              help="Events per window; each batch waits for the broker's ack.")
@click.option("--field", "-f", "field_pairs", multiple=True, metavar="K=V",
              help="A field added to every event (repeatable), e.g. -f host=web1.")
@click.option("--protocol", "version", type=click.Choice(["1", "2"]), default="2", show_default=True,
              help="1: string maps (logstash-forwarder); 2: JSON (Beats).")
@click.option("--no-compress", is_flag=True, help="Plain frames instead of one compressed frame per batch.")
@click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False),
              help="Verify the broker against this CA.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="Client certificate (PEM).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="Client certificate key (PEM).")
def lumberjack_ship(source: Any, address: tuple[str, int], batch: int, field_pairs: tuple[str, ...],
                    version: str, no_compress: bool, tls_ca: str | None, tls_cert: str | None,
                    tls_key: str | None) -> None:
    """Ship each line of SOURCE (a file, or - for stdin) as an event {"message": line, ...fields}."""
    import ssl

    from connector.lumberjack_client import LumberjackClient

    extra = {key: value for key, value in (pair.partition("=")[::2] for pair in field_pairs)}
    tls = None
    if tls_ca or tls_cert:
        tls = ssl.create_default_context(cafile=tls_ca)
        if tls_cert:
            tls.load_cert_chain(tls_cert, tls_key)
    def batches() -> Iterator[list[dict[str, Any]]]:
        events: list[dict[str, Any]] = []
        for line in source:
            events.append({"message": line.rstrip(b"\r\n").decode("utf-8", "replace"), **extra})
            if len(events) == batch:
                yield events
                events = []
        yield events

    with LumberjackClient(*address, version=int(version), tls=tls) as client:
        shipped = client.send_batches(batches(), compress=not no_compress)
    click.echo(f"shipped {shipped} event(s), every one acknowledged", err=True)


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
@click.option("--segment-bytes", type=click.IntRange(min=1), metavar="N",
              help="Persistent topics: seal a segment file at N bytes.")
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
TOPIC_COLUMNS = (("topic", False), ("delivery", False), ("persistence", False), ("messages", True),
                 ("first", True), ("last", True), ("bytes", True), ("subs", True), ("lag", True),
                 ("dropped", True))


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _topic_row(name: str, topic: dict[str, Any]) -> list[str]:
    """One ``mc0 topics`` row; keys a broker does not send (transient topics have no log) show as "-"."""
    persistence = _cell(topic.get("persistence"))
    if topic.get("sync"):
        persistence += f"/{topic['sync']}"
    stored = topic.get("stored")
    messages = stored if stored is not None else topic.get("messages_in")
    first, last = topic.get("first_id"), topic.get("last_id")
    if stored == 0 or last == 0:
        first = last = None  # ids start at 1: nothing stored (or nothing ever published) has no id range
    return [name, _cell(topic.get("delivery")), persistence, _cell(messages), _cell(first), _cell(last),
            _cell(topic.get("bytes")), _cell(topic.get("subscribers")), _cell(topic.get("lag")),
            _cell(topic.get("dropped"))]


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
@click.option("--keys", "keys_dir", default="keys", envvar="MC0_KEYS", show_default=True,
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
