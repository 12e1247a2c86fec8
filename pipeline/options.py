"""The options of the ``mc0`` data source: which exist, where each applies, and what they mean once checked.

Named as in Spark's Kafka source wherever the meaning is Kafka's, so that a Kafka user's code reads right;
ours where mc0 differs (the broker endpoint, CURVE keys, long polls). Every option is checked before anything
runs, case-insensitively as Spark's own are: an unknown option is an error that suggests the nearest known
name (a typo like ``maxOffsetPerTrigger`` must not be silently ignored), an option that does not apply to the
mode (the batch-only ``endingOffsets`` on a stream) is an error that says where it applies, and a Kafka option
mc0 cannot honour is an error that says why. :data:`OPTIONS` and :data:`REFUSED` are also the table in
``docs/pipeline.md``.

This module knows options and their values only: no Spark, no broker.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

DEFAULT_BROKER = "tcp://127.0.0.1:61616"
#: Messages per partition (Spark task) at most unless ``maxRecordsPerPartition`` says otherwise: a bound on
#: one task's memory and time, not what spreads the work (that is minPartitions, below).
DEFAULT_MAX_RECORDS_PER_PARTITION = 1_000_000
#: Without minPartitions, a read is split into as many tasks as Spark's default parallelism (its cores), but
#: not into tasks smaller than this: a task's fixed cost (a Python worker's turn, a connection, about 50 ms)
#: must stay small next to its reading (bench/spark.py: 10,000 messages take about 10 ms to read).
MIN_DEFAULT_SPLIT = 50_000
#: How long the driver's long poll waits for a new message before it answers "nothing new" (Kafka's
#: fetch.max.wait.ms default); an idle query then costs about two commands a second per topic.
DEFAULT_FETCH_MAX_WAIT_MS = 500
#: How often a ``subscribePattern`` stream looks for new matching topics.
DEFAULT_TOPIC_DISCOVERY_MS = 5_000
#: Kafka's default maxTriggerDelay: how long minOffsetsPerTrigger may hold a micro-batch back.
DEFAULT_MAX_TRIGGER_DELAY = "15m"
DEFAULT_CONNECT_TIMEOUT_MS = 10_000
DEFAULT_REQUEST_TIMEOUT_MS = 60_000


class Mode(Enum):
    READ = "batch reads (spark.read)"
    STREAM = "streaming reads (spark.readStream)"
    WRITE = "batch writes (df.write)"
    WRITE_STREAM = "streaming writes (df.writeStream)"


READS = frozenset({Mode.READ, Mode.STREAM})
WRITES = frozenset({Mode.WRITE, Mode.WRITE_STREAM})
EVERY = READS | WRITES


@dataclass(frozen=True)
class Option:
    name: str
    modes: frozenset[Mode]
    kafka: bool  # the name and meaning are Kafka's (else: ours)
    default: str
    meaning: str


OPTIONS: tuple[Option, ...] = (
    Option("broker", EVERY, False, DEFAULT_BROKER,
           "the mc0 endpoint, or a cluster's members separated by commas (what kafka.bootstrap.servers is "
           "to Kafka): readers and writers follow the cluster's leader"),
    Option("curve", EVERY, False, "true", "`false` for a broker run with `--no-curve`"),
    Option("keys", EVERY, False, "keys", "a keys folder with `broker.key` and `client.key_secret`"),
    Option("serverKey", EVERY, False, "", "CURVE keys as Z85 text instead of a folder (all three together)"),
    Option("publicKey", EVERY, False, "", "see serverKey"),
    Option("secretKey", EVERY, False, "", "see serverKey"),
    Option("connectTimeoutMs", EVERY, False, str(DEFAULT_CONNECT_TIMEOUT_MS),
           "how long a connection waits for the broker before the query fails (broker down, wrong key)"),
    Option("requestTimeoutMs", EVERY, False, str(DEFAULT_REQUEST_TIMEOUT_MS),
           "how long one request waits for its answer (Kafka's kafkaConsumer.pollTimeoutMs)"),
    Option("subscribe", READS, True, "", "comma-separated topics (persistent ones: only those have a log)"),
    Option("subscribePattern", READS, True, "",
           "a regular expression (Python `re`, matched against the whole name) over persistent topic names; "
           "a stream picks up new matching topics, from their beginning"),
    Option("startingOffsets", READS, True, "`earliest` (batch), `latest` (stream)",
           "`earliest`, `latest`, or JSON: `{\"t\": 23}` or Kafka's `{\"t\": {\"0\": 23}}`, an id being the "
           "first message wanted (-2 earliest, -1 latest)"),
    Option("startingTimestamp", READS, True, "",
           "ms since the epoch: every topic from its first message stored at or after it"),
    Option("startingOffsetsByTimestamp", READS, True, "",
           "JSON, per topic: `{\"t\": 1700000000000}` or `{\"t\": {\"0\": 1700000000000}}`"),
    Option("startingOffsetsByTimestampStrategy", READS, True, "error",
           "no message at or after the time: `error` fails, `latest` starts at the end"),
    Option("endingOffsets", frozenset({Mode.READ}), True, "latest",
           "`latest` or JSON (-1 latest); the end is exclusive: the first id not read"),
    Option("endingTimestamp", frozenset({Mode.READ}), True, "",
           "ms since the epoch: every topic up to (not including) its first message at or after it"),
    Option("endingOffsetsByTimestamp", frozenset({Mode.READ}), True, "", "JSON, per topic, as above"),
    Option("failOnDataLoss", READS, True, "true",
           "messages a query was to read are gone (retention, a recreated log, a log cut back after a "
           "machine restart): `true` fails, `false` logs a warning and reads on from what is there"),
    Option("minPartitions", READS, True, "Spark's default parallelism",
           "at least this many Spark tasks read (without it: one per core, none under 50,000 messages)"),
    Option("maxRecordsPerPartition", READS, True, str(DEFAULT_MAX_RECORDS_PER_PARTITION),
           "at most this many messages per Spark task"),
    Option("includeHeaders", EVERY, True, "false",
           "reads: add `headers`, `array<struct<key: string, value: binary>>`, as Kafka's; writes: changes "
           "nothing, as in Kafka's sink (a `headers` column is written whenever there is one)"),
    Option("checkCrcs", READS, False, "true",
           "check each record's CRC on the executor (Kafka's check.crcs)"),
    Option("maxOffsetsPerTrigger", frozenset({Mode.STREAM}), True, "",
           "at most this many messages per micro-batch, shared between topics by what each has waiting"),
    Option("minOffsetsPerTrigger", frozenset({Mode.STREAM}), True, "",
           "wait for at least this many new messages before a micro-batch, up to maxTriggerDelay"),
    Option("maxTriggerDelay", frozenset({Mode.STREAM}), True, DEFAULT_MAX_TRIGGER_DELAY,
           "how long minOffsetsPerTrigger may delay a micro-batch (`500ms`, `30s`, `15m`, `1h`)"),
    Option("fetchMaxWaitMs", frozenset({Mode.STREAM}), False, str(DEFAULT_FETCH_MAX_WAIT_MS),
           "an idle stream's long poll: how long the broker holds the driver's question for a new message "
           "(0: ask without waiting)"),
    Option("topicDiscoveryIntervalMs", frozenset({Mode.STREAM}), False, str(DEFAULT_TOPIC_DISCOVERY_MS),
           "with subscribePattern: how often the driver looks for new matching topics"),
    Option("topic", WRITES, True, "",
           "the topic every row goes to; overrides a `topic` column (as in Kafka)"),
    Option("writeId", frozenset({Mode.WRITE}), False, "a new one per write",
           "names a batch write: the same writeId with the same rows lands once (e.g. the batch id in "
           "foreachBatch)"),
)

#: Options mc0 cannot honour (Kafka's, and ``path``), spelled as Kafka spells them, and why; any other
#: ``kafka.*`` is refused too (:data:`KAFKA_PREFIX_REASON`).
_NO_GROUP = ("reads use no consumer group: a query's position lives in its checkpoint and the broker keeps "
             "nothing per reader")
REFUSED: dict[str, str] = {
    "assign": "mc0 topics have no partitions: name whole topics with subscribe or subscribePattern",
    "kafka.group.id": _NO_GROUP,
    "groupIdPrefix": _NO_GROUP,
    "fetchOffset.numRetries": "the broker answers offsets itself, at once: there is nothing to retry "
                              "(requestTimeoutMs bounds a request)",
    "fetchOffset.retryIntervalMs": "the broker answers offsets itself, at once: there is nothing to retry",
    "kafkaConsumer.pollTimeoutMs": "use requestTimeoutMs",
    "path": "mc0 reads and writes topics, not paths: name them with subscribe (reads) or topic (writes)",
}
KAFKA_PREFIX = "kafka."
KAFKA_PREFIX_REASON = ("mc0 is not Kafka: name the broker with `broker` (an mc0 endpoint) and secure it with "
                       "curve, keys or serverKey/publicKey/secretKey")
#: Options Spark itself adds (lower case), by mode.
SPARK_OWN = {Mode.WRITE_STREAM: frozenset({"checkpointlocation"})}

_BY_LOWER = {option.name.lower(): option for option in OPTIONS}
_REFUSED_BY_LOWER = {name.lower(): name for name in REFUSED}
#: How alike a misspelt name must be to a known one to be suggested (difflib's ratio): catches a letter
#: missing, doubled or swapped, or a unit dropped (``kafkaConsumer.pollTimeout``), not another word.
NEAR = 0.75


class OptionError(ValueError):
    """An option that is unknown, does not apply, or has a bad value (Spark shows an AnalysisException)."""


def check(options: Mapping[str, str], mode: Mode | None) -> None:
    """Every option known and meant for ``mode``; OptionError with the nearest name otherwise. ``mode`` None
    (a read, batch or stream, not yet known: Spark asks the schema before it says) checks names only."""
    for key in options:
        lower = key.lower()
        if mode is not None and lower in SPARK_OWN.get(mode, ()):
            continue
        option = _BY_LOWER.get(lower)
        if option is not None:
            if mode is not None and mode not in option.modes:
                where = " and ".join(m.value for m in Mode if m in option.modes)
                raise OptionError(f"option {option.name} applies to {where}, not to {mode.value}")
            continue
        refused = _REFUSED_BY_LOWER.get(lower)
        if refused is not None:
            raise OptionError(f"option {key} is not supported by format mc0: {REFUSED[refused]}")
        if lower.startswith(KAFKA_PREFIX):
            # Every other kafka.* is refused for this one reason, so no near miss is looked for among them
            # (kafka.group.instance.id is not a misspelt kafka.group.id).
            raise OptionError(f"option {key} is not supported by format mc0: {KAFKA_PREFIX_REASON}")
        near = difflib.get_close_matches(lower, [*_BY_LOWER, *_REFUSED_BY_LOWER], n=1, cutoff=NEAR)
        if near and near[0] in _REFUSED_BY_LOWER:  # a near miss of a name mc0 refuses: say so, and why
            name = _REFUSED_BY_LOWER[near[0]]
            raise OptionError(f"unknown option {key} for format mc0: did you mean {name}? format mc0 does "
                              f"not support it: {REFUSED[name]}")
        hint = f"did you mean {_BY_LOWER[near[0]].name}? " if near else ""
        modes = READS if mode is None else {mode}
        names = ", ".join(o.name for o in OPTIONS if o.modes & modes)
        where = "reads" if mode is None else mode.value
        raise OptionError(f"unknown option {key} for format mc0 ({where}): {hint}the options are {names}")


def flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    if value.strip().lower() not in ("true", "false"):
        raise OptionError(f"option {name} must be true or false, not {value!r}")
    return value.strip().lower() == "true"


def count(options: Mapping[str, str], name: str, default: int | None = None, minimum: int = 1) -> int | None:
    value = options.get(name)
    if value is None:
        return default
    text = value.strip()
    if not text.isdigit() or int(text) < minimum:
        raise OptionError(f"option {name} must be an integer of at least {minimum}, not {value!r}")
    return int(text)


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*", re.IGNORECASE)
_UNIT_MS = {None: 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(options: Mapping[str, str], name: str, default: str) -> int:
    """``500ms``, ``30s``, ``15m``, ``1h``, ``2d`` or a number of milliseconds."""
    value = options.get(name, default)
    match = _DURATION.fullmatch(value)
    if match is None:
        raise OptionError(f"option {name} must be a duration like 500ms, 30s, 15m or 1h, not {value!r}")
    unit = match.group(2).lower() if match.group(2) else None
    return math.ceil(float(match.group(1)) * _UNIT_MS[unit])


def topics_json(value: str, name: str) -> dict[str, int]:
    """A per-topic JSON object of integers, in our form ``{"t": 23}`` or Kafka's ``{"t": {"0": 23}}`` (mc0
    topics are single logs: partition "0" only)."""
    try:
        given = json.loads(value)
    except ValueError:
        raise OptionError(f"option {name} must be a JSON object like {{\"topic\": 23}} or Kafka's "
                          f"{{\"topic\": {{\"0\": 23}}}}, not {value!r}") from None
    if not isinstance(given, dict):
        raise OptionError(f"option {name} must be a JSON object of topics, not {value!r}")
    out = {}
    for topic, entry in given.items():
        if isinstance(entry, dict):  # Kafka's shape: partition -> offset; our topics have one log
            if set(entry) != {"0"}:
                raise OptionError(f"option {name}: topic {topic!r} names partitions {sorted(entry)}; mc0 "
                                  "topics have no partitions (one log each: use \"0\", or just the number)")
            entry = entry["0"]
        if not isinstance(entry, int) or isinstance(entry, bool):
            raise OptionError(f"option {name}: topic {topic!r} must map to an integer, not {entry!r}")
        out[topic] = entry
    return out


@dataclass(frozen=True)
class Connection:
    """How to reach the broker: what every reader and writer, on the driver and on executors, needs."""

    broker: str
    curve: bool
    keys: str | None
    server_key: str | None
    public_key: str | None
    secret_key: str | None
    connect_timeout: float
    request_timeout: float

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Connection:
        z85 = [options.get(name) for name in ("serverKey", "publicKey", "secretKey")]
        if any(z85) and not all(z85):
            raise OptionError("options serverKey, publicKey and secretKey go together (CURVE keys, Z85 text)")
        return cls(
            broker=options.get("broker", DEFAULT_BROKER),
            curve=flag(options, "curve", True),
            keys=options.get("keys"),
            server_key=z85[0],
            public_key=z85[1],
            secret_key=z85[2],
            connect_timeout=(count(options, "connectTimeoutMs", DEFAULT_CONNECT_TIMEOUT_MS) or 0) / 1000,
            request_timeout=(count(options, "requestTimeoutMs", DEFAULT_REQUEST_TIMEOUT_MS) or 0) / 1000,
        )

    def client(self) -> object:
        """A connected :class:`connector.Client` (imported here: executors import it when they run). A broker
        that does not answer within connectTimeoutMs fails this call, with the connector's reason and, when
        only the wait ended it, what to do."""
        from connector import Client, ConnectorError, Credentials

        options: dict[str, object] = {"timeout": self.connect_timeout}
        if not self.curve:
            options["curve"] = False
        elif self.server_key and self.public_key and self.secret_key:
            options["credentials"] = Credentials(self.server_key.encode(), self.public_key.encode(),
                                                 self.secret_key.encode())
        else:
            options["keys"] = self.keys or "keys"
        started = time.monotonic()
        try:
            client = Client(self.broker, **options)  # type: ignore[arg-type]
        except ConnectorError as error:
            if time.monotonic() - started < self.connect_timeout:
                raise  # the connector knew why before the wait ran out, and says what to do
            # Only the wait ended it (a broker that accepts connections and never answers): say what to do.
            raise ConnectorError(f"{error} (waited connectTimeoutMs={round(self.connect_timeout * 1000)}): "
                                 f"check that an mc0 broker runs and answers at {self.broker}, or give it "
                                 "longer with connectTimeoutMs") from None
        client.timeout = self.request_timeout  # connected: from now on requests wait this long
        return client
