"""Broker configuration: embedded defaults, an optional TOML file, and command-line overrides on top.

No file is needed to run a broker: :data:`DEFAULTS` is a complete configuration. A file only names what it
changes (see ``docs/configuration.md``); unknown keys are errors, so a typo never silently does nothing.
"""

from __future__ import annotations

import dataclasses
import glob
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.topics import DEFAULT_SPEC, Delivery, Persistence, Sync, TopicRule, TopicRules, TopicSpec
from connector import addresses

DEFAULT_BIND = "tcp://*:61616"
#: The sexp gateway's default address: loopback, the mc0 port plus one (the seed names no port).
DEFAULT_SEXP = "127.0.0.1:61617"
#: The msgq gateway's default address: loopback, the 2009 routing daemon's port.
DEFAULT_MSGQ = "127.0.0.1:9912"
#: The reactive-streams gateway's default address: loopback, the mc0 port plus two (the draft names none).
DEFAULT_RSTREAMS = "127.0.0.1:61618"
#: The Lumberjack gateway's default address: loopback, the Beats port.
DEFAULT_LUMBERJACK = "127.0.0.1:5044"
#: The monitoring endpoint's default address: loopback, the port NATS users know for monitoring.
DEFAULT_HTTP = "127.0.0.1:8222"
#: Topics that get their own ``topic`` label in /metrics by default (the busiest; the rest are summed).
DEFAULT_HTTP_TOPIC_LABELS = 100
#: Topics whose names start with this are persistent and strong unless a configured rule says otherwise: the
#: examples that replay use them, and so can anyone who wants durability without a configuration file.
DURABLE_PREFIX = "durable."
#: A gateway address that turns the gateway off.
OFF = "off"
#: Relative to the broker's working directory; created only when the first persistent topic is opened.
DEFAULT_DATA_DIR = Path("mc0-data")


class ConfigError(Exception):
    """The configuration cannot be used; the message says which key and why."""


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    bind: str = DEFAULT_BIND
    keys_dir: Path = Path("keys")
    curve: bool = True  # CURVE encryption on the mc0 ROUTER
    allow_any_client: bool = False  # CURVE without the allow-list of client keys
    heartbeat_tick: float = 1.0  # seconds between heartbeat checks (shortened for short client TTLs)
    pending_limit: int = 100_000  # deliveries held per client before drops are counted
    max_message_size: int = 16 << 20  # bytes per frame; larger frames disconnect the peer (libzmq)
    send_hwm: int = 100_000  # ZeroMQ high-water marks, in frame sets
    recv_hwm: int = 100_000
    topics: tuple[TopicRule, ...] = field(default_factory=tuple)
    log_level: str = "INFO"
    data_dir: Path = DEFAULT_DATA_DIR  # where persistent topics keep their logs
    weak_sync_interval: float = 2.0  # seconds between fsyncs of weak topics ("flushed every few seconds")
    retention_interval: float = 1.0  # seconds between retention checks
    sexp: str = DEFAULT_SEXP  # HOST:PORT of the sexp gateway, or "off"
    sexp_ping_interval: float = 50.0  # seconds between Pings to each sexp client
    msgq: str = DEFAULT_MSGQ  # HOST:PORT of the msgq gateway, or "off"
    msgq_max_message: int = 64 * 1024  # bytes in one msgq message (the dialect's cap), both ways
    rstreams: str = DEFAULT_RSTREAMS  # HOST:PORT of the reactive-streams gateway, or "off"
    rstreams_part_size: int = 64 * 1024  # elements larger than this are sent split into parts
    lumberjack: str = DEFAULT_LUMBERJACK  # HOST:PORT of the Lumberjack gateway, or "off"
    lumberjack_topic: str = "logs"  # the topic events go to
    lumberjack_topic_field: str = ""  # a field path ("fields.topic"): its string value names the topic
    lumberjack_tls_cert: str = ""  # PEM certificate (chain) and key: TLS on the Lumberjack port when set
    lumberjack_tls_key: str = ""
    lumberjack_tls_client_ca: str = ""  # PEM CA bundle: clients must present a certificate it signed
    event_loop: str = "auto"  # auto (uvloop where installed) | uvloop | asyncio
    mc0_engine: str = "auto"  # the mc0 port: auto | native (the broker's own ZMTP) | zeromq (libzmq's)
    # HOST:PORT of the monitoring endpoint (metrics, health, JSON, dashboard), or "off". None: DEFAULT_HTTP,
    # and only if that port is free (several brokers on one machine still start with their defaults).
    http: str | None = None
    http_topic_labels: int = DEFAULT_HTTP_TOPIC_LABELS  # topics labelled in /metrics; 0: no topic labels
    max_waiting_fetches: int = 10_000  # FETCHes with WAIT held at once (beyond it they are answered at once)
    # Limits: what no client can take beyond (docs/configuration.md, "Limits").
    handshake_timeout: float = 5.0  # seconds a new connection may take to say anything (CURVE: to finish)
    max_open_files: int = 0  # descriptors the store keeps open at most; 0 = a quarter of the process limit
    descriptor_reserve: int = 64  # descriptors kept free beyond the store's share; doors pause to keep them
    input_budget: int = 256 << 20  # bytes of unfinished input all TCP gateway connections may hold together
    session_idle: float = 60.0  # seconds of silence after which an mc0 client without TTL is probed
    max_sessions: int = 100_000  # mc0 sessions at most; past it, those heard from longest ago are dropped
    max_topics: int = 1_000_000  # topics at once; another is refused
    topic_idle: float = 60.0  # seconds a transient topic with no subscriber and nothing waiting is kept
    # A cluster (docs/cluster.md): off while cluster_node is empty, and then nothing of it runs.
    cluster_node: str = ""  # HOST:PORT of this broker's Raft (consensus) port
    cluster_peers: tuple[str, ...] = ()  # the other brokers' Raft HOST:PORT
    cluster_name: str = "mc0"  # part of the Raft password: two clusters sharing keys still do not mix
    advertise: str = ""  # the mc0 endpoint clients and other brokers reach this one at; "" = from bind
    cluster_timeout: float = 0.5  # seconds: Raft's shortest election timeout (the longest is twice it)
    cluster_commit_timeout: float = 5.0  # seconds a strong OK waits for a majority before it is an ERROR
    cluster_secret: str = ""  # the Raft password when CURVE is off ("" = Raft traffic in the clear)

    @property
    def clustered(self) -> bool:
        return bool(self.cluster_node)

    def advertised(self, bound: str) -> str:
        """The mc0 endpoint this broker gives clients and other brokers: ``advertise``, or the endpoint it
        bound when that names a host others can reach (not ``*`` or ``0.0.0.0``)."""
        if self.advertise:
            return addresses.zmq_endpoint(self.advertise, what="advertise")
        if "://*:" in bound or "://0.0.0.0:" in bound or "://[::]:" in bound:
            raise ConfigError(f"this broker binds {bound}: set advertise (or --advertise) to the address "
                              "clients and the other brokers of the cluster reach it at")
        return bound

    @property
    def allowlist_dir(self) -> Path:
        return self.keys_dir / "allowed"

    def gateway_address(self, name: str) -> tuple[str, int] | None:
        """Where gateway ``name`` listens, or None when it is off (the value was checked on load)."""
        return listen_address(getattr(self, name), name)

    @property
    def http_address(self) -> tuple[str, int] | None:
        """Where the monitoring endpoint listens, or None when it is off (the value was checked on load)."""
        return listen_address(DEFAULT_HTTP if self.http is None else self.http, "http")

    def topic_rules(self) -> TopicRules:
        """The configured rules, then the default ones (:meth:`default_rules`): the first match wins."""
        return TopicRules([*self.topics, *self.default_rules()])

    def default_rules(self) -> tuple[TopicRule, ...]:
        """The rules every broker has after its configured ones: topics named ``durable.*`` are persistent
        and strong, and so is the Lumberjack door's topic, whose ACK then means "on disk". A configured rule
        for the same names comes first and wins (``persistence = "transient"`` undoes one)."""
        strong = TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG)
        rules = [TopicRule(glob.escape(DURABLE_PREFIX) + "*", strong)]
        if self.lumberjack_topic:
            rules.append(TopicRule(glob.escape(self.lumberjack_topic), strong))
        return tuple(rules)

    def replace(self, **changes: Any) -> BrokerConfig:
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


DEFAULTS = BrokerConfig()

_BROKER_KEYS = {
    "bind": str, "keys_dir": str, "curve": bool, "allow_any_client": bool, "heartbeat_tick": (int, float),
    "pending_limit": int, "max_message_size": int, "send_hwm": int, "recv_hwm": int, "log_level": str,
    "data_dir": str, "weak_sync_interval": (int, float), "retention_interval": (int, float),
    "sexp": str, "sexp_ping_interval": (int, float), "msgq": str, "msgq_max_message": int,
    "rstreams": str, "rstreams_part_size": int, "lumberjack": str, "lumberjack_topic": str,
    "lumberjack_topic_field": str, "lumberjack_tls_cert": str, "lumberjack_tls_key": str,
    "lumberjack_tls_client_ca": str, "event_loop": str, "mc0_engine": str, "http": str,
    "http_topic_labels": int,
    "max_waiting_fetches": int,
    "handshake_timeout": (int, float), "max_open_files": int,
    "descriptor_reserve": int, "input_budget": int, "session_idle": (int, float), "max_sessions": int,
    "max_topics": int, "topic_idle": (int, float),
    "cluster_node": str, "cluster_peers": list, "cluster_name": str, "advertise": str,
    "cluster_timeout": (int, float), "cluster_commit_timeout": (int, float), "cluster_secret": str,
}
#: Keys holding a gateway's HOST:PORT (or "off").
GATEWAYS = ("sexp", "msgq", "rstreams", "lumberjack")

#: Numbers that make no sense at zero or below: a zero tick would spin the loop, a zero limit drop everything,
#: and a zero high-water mark means "unbounded" to ZeroMQ, which breaks the promise of bounded memory.
_POSITIVE = frozenset({"heartbeat_tick", "pending_limit", "max_message_size", "send_hwm", "recv_hwm",
                       "weak_sync_interval", "retention_interval", "sexp_ping_interval",
                       "msgq_max_message", "rstreams_part_size", "max_waiting_fetches", "handshake_timeout",
                       "input_budget", "session_idle", "max_sessions", "max_topics", "topic_idle",
                       "cluster_timeout", "cluster_commit_timeout"})
#: Numbers where 0 means something ("decide for me", "none") and below it nothing does.
_NON_NEGATIVE = frozenset({"max_open_files", "descriptor_reserve"})

#: The event loops a broker runs on (``event_loop``): auto takes uvloop where it is installed.
EVENT_LOOPS = ("auto", "uvloop", "asyncio")

#: What serves the mc0 port (``mc0_engine``): the broker's own ZMTP engine (broker/zmtp_door.py) where it can
#: (auto: a TCP address the broker listens on itself), or libzmq's ROUTER.
MC0_ENGINES = ("auto", "native", "zeromq")

#: The level names the standard ``logging`` module knows (it refuses any other string).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def listen_address(text: str, where: str) -> tuple[str, int] | None:
    """A TCP door's ``HOST:PORT`` (or ``tcp://HOST:PORT``, ``[v6]:PORT``, or a bare port on loopback), or None
    for ``off``. Port 0 picks a free port. One reader for the file and the command line
    (:mod:`connector.addresses`)."""
    if text.strip().lower() == OFF:
        return None
    try:
        return addresses.host_port(text, what=where)
    except addresses.AddressError as error:
        raise ConfigError(f"{error} (or {OFF!r})") from None


def bind_endpoint(text: str, where: str = "bind") -> str:
    """The mc0 door's ZeroMQ endpoint to bind (``tcp://HOST:PORT``, ``HOST:PORT``, or a port on every
    interface)."""
    try:
        return addresses.zmq_endpoint(text, what=where, bind=True)
    except addresses.AddressError as error:
        raise ConfigError(str(error)) from None


def raft_address(text: str, where: str) -> str:
    """A cluster member's Raft address as ``HOST:PORT`` (the form PySyncObj names nodes by): every broker
    must spell each address the same way, so it is normalised here."""
    try:
        host, port = addresses.host_port(text, what=where)
    except addresses.AddressError as error:
        raise ConfigError(str(error)) from None
    if port == 0:
        raise ConfigError(f"{where}: {text!r}: a Raft address needs a fixed port (the others must know it)")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_engine(config: BrokerConfig) -> None:
    """Refuse, in one line, an mc0 engine the rest of the configuration rules out."""
    if config.mc0_engine not in MC0_ENGINES:
        raise ConfigError(f"mc0_engine {config.mc0_engine!r} is not one of {', '.join(MC0_ENGINES)}")
    if config.mc0_engine != "native":
        return
    if not config.bind.startswith("tcp://"):
        raise ConfigError(f"mc0_engine 'native' listens on TCP only, not {config.bind}: use mc0_engine "
                          "'zeromq'")


def check_cluster(config: BrokerConfig) -> None:
    """Refuse, in one line, a cluster configuration that cannot work."""
    if not config.cluster_node:
        if config.cluster_peers:
            raise ConfigError("cluster_peers is set but cluster_node is not: set this broker's own Raft "
                              "address (--cluster-node HOST:PORT)")
        return
    if not config.cluster_peers:
        raise ConfigError("cluster_node is set but cluster_peers is empty: list the other brokers' Raft "
                          "addresses (--cluster-peer HOST:PORT, once per broker)")
    if config.cluster_node in config.cluster_peers:
        raise ConfigError(f"cluster_peers lists this broker's own address {config.cluster_node}: list only "
                          "the others")
    try:
        host, _ = addresses.host_port(config.cluster_node, what="cluster_node")
    except addresses.AddressError as error:
        raise ConfigError(str(error)) from None
    if not config.curve and not config.cluster_secret and not addresses.is_loopback(host):
        # PySyncObj unpickles what its peers send: unauthenticated Raft off loopback runs anyone's code.
        raise ConfigError(f"cluster_node {config.cluster_node} is reachable from other machines, and with "
                          "CURVE off and no cluster_secret its Raft traffic would be unauthenticated: turn "
                          "CURVE on or set cluster_secret")


def _enum(kind: type, raw: Any, where: str) -> Any:
    try:
        return kind(raw)
    except (ValueError, TypeError):
        choices = ", ".join(member.value for member in kind)
        raise ConfigError(f"{where}: {raw!r} is not one of {choices}") from None


#: Topic settings a rule (or a DECLARE) may give, with their types. A bool is never an acceptable int.
_SETTINGS: dict[str, type | tuple[type, ...]] = {
    "delivery": str, "persistence": str, "sync": str, "max_backlog": int, "retention_bytes": int,
    "retention_seconds": (int, float), "segment_bytes": int, "element_size": int,
}


def topic_spec(settings: dict[str, Any], where: str) -> TopicSpec:
    """A TopicSpec from setting names to values (a ``[[topics]]`` table without its pattern, or a DECLARE)."""
    unknown = set(settings) - set(_SETTINGS)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    for key, value in settings.items():
        wanted = _SETTINGS[key]
        if wanted is str:
            continue  # the enum lookup below names the accepted values
        if not isinstance(value, wanted) or isinstance(value, bool):
            kind = "an integer" if wanted is int else "a number"
            raise ConfigError(f"{where}.{key}: must be {kind}, not {value!r}")
    # Not ``TopicSpec.max_backlog``: on a slots dataclass that is the field's descriptor, not its default.
    try:
        return TopicSpec(
            delivery=_enum(Delivery, settings.get("delivery", "broadcast"), f"{where}.delivery"),
            persistence=_enum(Persistence, settings.get("persistence", "transient"), f"{where}.persistence"),
            sync=None if "sync" not in settings else _enum(Sync, settings["sync"], f"{where}.sync"),
            max_backlog=settings.get("max_backlog", DEFAULT_SPEC.max_backlog),
            retention_bytes=settings.get("retention_bytes"),
            retention_seconds=settings.get("retention_seconds"),
            segment_bytes=settings.get("segment_bytes", DEFAULT_SPEC.segment_bytes),
            element_size=settings.get("element_size", 0),
        )
    except ValueError as error:
        raise ConfigError(f"{where}: {error}") from None


def parse_topic_rule(entry: dict[str, Any], where: str) -> TopicRule:
    pattern = entry.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError(f"{where}: needs a non-empty string 'pattern'")
    return TopicRule(pattern, topic_spec({k: v for k, v in entry.items() if k != "pattern"}, where))


def declared_spec(settings: dict[str, str]) -> TopicSpec:
    """The spec a DECLARE asks for: its text values read as the types a ``[[topics]]`` rule uses."""
    typed: dict[str, Any] = {}
    for key, text in settings.items():
        wanted = _SETTINGS.get(key, str)
        if wanted is str:
            typed[key] = text
            continue
        try:
            typed[key] = int(text) if wanted is int else float(text)
        except ValueError:
            raise ConfigError(f"settings: {key} {text!r} is not a number") from None
    # "settings", not "DECLARE": the client already says which command the broker refused.
    return topic_spec(typed, "settings")


def load(path: Path | None, base: BrokerConfig = DEFAULTS) -> BrokerConfig:
    """The configuration in ``path`` on top of ``base`` (the embedded defaults)."""
    if path is None:
        return base
    try:
        # TOML is UTF-8 whatever the locale says.
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: {error}") from None
    unknown = set(data) - {"broker", "topics"}
    if unknown:
        raise ConfigError(f"{path}: unknown sections {sorted(unknown)}")
    broker = data.get("broker", {})
    if not isinstance(broker, dict):
        raise ConfigError(f"{path}: 'broker' must be a table ([broker])")
    changes: dict[str, Any] = {}
    for key, value in broker.items():
        if key not in _BROKER_KEYS:
            raise ConfigError(f"{path}: [broker] has no key {key!r}")
        # bool is a subclass of int in Python, but `pending_limit = true` is a mistake, not the number 1.
        wanted = _BROKER_KEYS[key]
        if not isinstance(value, wanted) or (isinstance(value, bool) and wanted is not bool):
            raise ConfigError(f"{path}: [broker].{key} has the wrong type")
        if key == "log_level":
            if value.upper() not in LOG_LEVELS:
                choices = ", ".join(LOG_LEVELS)
                raise ConfigError(f"{path}: [broker].log_level: {value!r} is not one of {choices}")
            value = value.upper()
        if key == "event_loop" and value not in EVENT_LOOPS:
            choices = ", ".join(EVENT_LOOPS)
            raise ConfigError(f"{path}: [broker].event_loop: {value!r} is not one of {choices}")
        if key == "mc0_engine" and value not in MC0_ENGINES:
            choices = ", ".join(MC0_ENGINES)
            raise ConfigError(f"{path}: [broker].mc0_engine: {value!r} is not one of {choices}")
        if key in _POSITIVE and value <= 0:
            raise ConfigError(f"{path}: [broker].{key} must be greater than 0, not {value!r}")
        if key in _NON_NEGATIVE and value < 0:
            raise ConfigError(f"{path}: [broker].{key} must be 0 or more, not {value!r}")
        if key in GATEWAYS or key == "http":
            listen_address(value, f"{path}: [broker].{key}")
        if key == "bind":
            value = bind_endpoint(value, f"{path}: [broker].bind")
        if key == "cluster_peers":
            if not all(isinstance(peer, str) for peer in value):
                raise ConfigError(f"{path}: [broker].cluster_peers must be a list of HOST:PORT strings")
            value = tuple(raft_address(peer, f"{path}: [broker].cluster_peers") for peer in value)
        if key == "cluster_node" and value:
            value = raft_address(value, f"{path}: [broker].cluster_node")
        if key == "advertise" and value:
            bind_endpoint(value, f"{path}: [broker].advertise")
        if key == "http_topic_labels" and value < 0:
            raise ConfigError(f"{path}: [broker].{key} must be 0 (no topic labels) or more, not {value}")
        changes[key] = Path(value) if key in ("keys_dir", "data_dir") else value
    entries = data.get("topics", [])
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise ConfigError(f"{path}: 'topics' must be an array of tables ([[topics]])")
    rules = tuple(parse_topic_rule(entry, f"{path}: topics[{n}]") for n, entry in enumerate(entries))
    if rules:
        changes["topics"] = rules
    return dataclasses.replace(base, **changes)
