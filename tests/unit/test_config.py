"""Broker configuration (broker/config.py) and topic rules (broker/topics.py): complete defaults without a
file, a TOML file overriding only what it names, topic rules matched by pattern with the first match
winning, and a ConfigError naming the culprit for unknown keys and sections, wrong types, bad enum values
and unreadable files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker import config
from broker.config import DEFAULTS, BrokerConfig, ConfigError, declared_spec, load, parse_topic_rule
from broker.topics import DEFAULT_SPEC, Delivery, Persistence, Sync, TopicRule, TopicRules, TopicSpec


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mc0.toml"
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------- defaults


def test_no_file_means_the_defaults() -> None:
    assert load(None) is DEFAULTS
    assert DEFAULTS.bind == "tcp://*:61616"
    assert DEFAULTS.curve is True
    assert DEFAULTS.allow_any_client is False
    assert DEFAULTS.keys_dir == Path("keys")
    assert DEFAULTS.allowlist_dir == Path("keys") / "allowed"
    assert DEFAULTS.topics == ()
    assert DEFAULTS.log_level == "INFO"


def test_default_topic_rules_give_transient_broadcast() -> None:
    spec = DEFAULTS.topic_rules().spec_for(b"anything at all")
    assert spec == DEFAULT_SPEC
    assert spec.delivery is Delivery.BROADCAST
    assert spec.persistence is Persistence.TRANSIENT
    assert spec.sync is None


def test_an_empty_file_changes_nothing(tmp_path: Path) -> None:
    assert load(write(tmp_path, "")) == DEFAULTS


def test_replace_ignores_options_that_were_not_given() -> None:
    changed = DEFAULTS.replace(bind="tcp://127.0.0.1:5555", curve=None, pending_limit=None)
    assert changed.bind == "tcp://127.0.0.1:5555"
    assert changed.curve is DEFAULTS.curve
    assert changed.pending_limit == DEFAULTS.pending_limit
    assert DEFAULTS.bind == "tcp://*:61616"  # frozen: the defaults are never modified


# ---------------------------------------------------------------------------------------------- overrides


def test_file_overrides_only_the_keys_it_names(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [broker]
        bind = "tcp://127.0.0.1:7000"
        keys_dir = "/etc/mc0/keys"
        curve = false
        heartbeat_tick = 1
        pending_limit = 500
        log_level = "debug"
        """,
    )
    loaded = load(path)
    assert loaded.bind == "tcp://127.0.0.1:7000"
    assert loaded.keys_dir == Path("/etc/mc0/keys")
    assert loaded.curve is False
    assert loaded.heartbeat_tick == 1
    assert loaded.pending_limit == 500
    assert loaded.log_level == "DEBUG"
    assert loaded.send_hwm == DEFAULTS.send_hwm
    assert loaded.max_message_size == DEFAULTS.max_message_size
    assert loaded.allow_any_client == DEFAULTS.allow_any_client


def test_file_is_layered_on_the_given_base(tmp_path: Path) -> None:
    base = BrokerConfig(bind="tcp://127.0.0.1:1", send_hwm=7)
    loaded = load(write(tmp_path, "[broker]\nrecv_hwm = 9\n"), base)
    assert (loaded.bind, loaded.send_hwm, loaded.recv_hwm) == ("tcp://127.0.0.1:1", 7, 9)


def test_topic_rules_first_match_wins(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [[topics]]
        pattern = "jobs.*"
        delivery = "round-robin"
        max_backlog = 50

        [[topics]]
        pattern = "jobs.audit"
        persistence = "persistent"

        [[topics]]
        pattern = "audit.*"
        persistence = "persistent"
        sync = "weak"

        [[topics]]
        pattern = "collective ?gent"
        """,
    )
    rules = load(path).topic_rules()
    jobs = rules.spec_for(b"jobs.audit")  # matches both the first and the second rule
    assert jobs == TopicSpec(delivery=Delivery.ROUND_ROBIN, max_backlog=50)
    assert rules.spec_for(b"audit.log") == TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.WEAK)
    assert rules.spec_for(b"collective agent") == TopicSpec()
    assert rules.spec_for(b"other") is DEFAULT_SPEC
    patterns = [rule.pattern for rule in load(path).topics]
    assert patterns == ["jobs.*", "jobs.audit", "audit.*", "collective ?gent"]


def test_persistent_topics_default_to_strong_sync() -> None:
    rule = parse_topic_rule({"pattern": "p", "persistence": "persistent"}, "topics[0]")
    assert rule.spec.sync is Sync.STRONG
    assert rule.spec.describe() == {"delivery": "broadcast", "persistence": "persistent", "sync": "strong",
                                    "segment_bytes": 64 << 20}


def test_patterns_match_whole_names_and_any_bytes() -> None:
    rules = TopicRules([TopicRule("orders", TopicSpec(delivery=Delivery.ROUND_ROBIN)),
                        TopicRule("bin.*", TopicSpec(max_backlog=1))])
    assert rules.spec_for(b"orders").delivery is Delivery.ROUND_ROBIN
    assert rules.spec_for(b"orders.eu") is rules.default
    assert rules.spec_for(b"ORDERS") is rules.default  # case matters, on every platform
    assert rules.spec_for(b"bin.\xff\xfe").max_backlog == 1


# ------------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[brokr]\nbind = 'x'\n", "unknown sections ['brokr']"),
        ("title = 'mc0'\n", "unknown sections ['title']"),
        ("[broker]\nbnid = 'x'\n", "[broker] has no key 'bnid'"),
        ("broker = 5\n", "'broker' must be a table"),
        ("[broker]\npending_limit = '10'\n", "[broker].pending_limit has the wrong type"),
        ("[broker]\npending_limit = true\n", "[broker].pending_limit has the wrong type"),
        ("[broker]\npending_limit = 1.5\n", "[broker].pending_limit has the wrong type"),
        ("[broker]\nheartbeat_tick = true\n", "[broker].heartbeat_tick has the wrong type"),
        ("[broker]\nheartbeat_tick = '0.1'\n", "[broker].heartbeat_tick has the wrong type"),
        ("[broker]\ncurve = 'yes'\n", "[broker].curve has the wrong type"),
        ("[broker]\ncurve = 1\n", "[broker].curve has the wrong type"),
        ("[broker]\nbind = 61616\n", "[broker].bind has the wrong type"),
        ("[broker]\nkeys_dir = ['a']\n", "[broker].keys_dir has the wrong type"),
        ("[broker]\nlog_level = 'LOUD'\n", "log_level: 'LOUD' is not one of DEBUG, INFO"),
        ("topics = 'x'\n", "'topics' must be an array of tables"),
        ("topics = [1, 2]\n", "'topics' must be an array of tables"),
        ("[topics]\npattern = 'a'\n", "'topics' must be an array of tables"),
        ("[[topics]]\ndelivery = 'broadcast'\n", "topics[0]: needs a non-empty string 'pattern'"),
        ("[[topics]]\npattern = ''\n", "topics[0]: needs a non-empty string 'pattern'"),
        ("[[topics]]\npattern = 5\n", "topics[0]: needs a non-empty string 'pattern'"),
        ("[[topics]]\npattern = 'a'\n[[topics]]\npattern = 'b'\nspeed = 1\n",
         "topics[1]: unknown keys ['speed']"),
        ("[[topics]]\npattern = 'a'\ndelivery = 'fanout'\n",
         "topics[0].delivery: 'fanout' is not one of broadcast, round-robin"),
        ("[[topics]]\npattern = 'a'\ndelivery = 1\n", "topics[0].delivery: 1 is not one of"),
        ("[[topics]]\npattern = 'a'\npersistence = 'disk'\n",
         "topics[0].persistence: 'disk' is not one of transient, persistent"),
        ("[[topics]]\npattern = 'a'\npersistence = 'persistent'\nsync = 'sometimes'\n",
         "topics[0].sync: 'sometimes' is not one of strong, weak, async"),
        ("[[topics]]\npattern = 'a'\nsync = 'weak'\n", "topics[0]: a transient topic has no sync level"),
        ("[[topics]]\npattern = 'a'\nmax_backlog = -1\n", "topics[0]: max_backlog must not be negative"),
        ("[[topics]]\npattern = 'a'\nmax_backlog = '10'\n", "topics[0].max_backlog: must be an integer"),
        ("[[topics]]\npattern = 'a'\nmax_backlog = [1]\n", "topics[0].max_backlog: must be an integer"),
        ("[[topics]]\npattern = 'a'\nmax_backlog = 2.5\n", "topics[0].max_backlog: must be an integer"),
        ("[broker]\nsexp = 'localhost'\n",
         "[broker].sexp: 'localhost' is not an address; use HOST:PORT, tcp://HOST:PORT or a port number "
         "(e.g. 127.0.0.1:61617) (or 'off')"),
        ("[broker]\nsexp = 'localhost:port'\n", "is not an address; use HOST:PORT"),
        ("[broker]\nsexp = 'localhost:70000'\n", "has no port 70000 (0 to 65535)"),
        ("[broker]\nsexp = ':61617'\n", "is not an address"),
        ("[broker]\nbind = 'tcp://127.0.0.1'\n", "[broker].bind: 'tcp://127.0.0.1' is not an address"),
        ("[broker]\nsexp_ping_interval = 0\n", "[broker].sexp_ping_interval must be greater than 0"),
        ("[[topics]]\npattern = 'a'\nelement_size = -1\n", "topics[0]: element_size must not be negative"),
        ("[[topics]]\npattern = 'a'\nelement_size = '8'\n", "topics[0].element_size: must be an integer"),
        ("[broker\n", "mc0.toml"),
        ("[broker]\nbind = 'a'\nbind = 'b'\n", "mc0.toml"),
    ],
)
def test_bad_configuration_is_refused_with_a_clear_message(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load(path)
    message = str(info.value)
    assert fragment in message
    assert str(path) in message  # the message always says which file


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read .*nowhere\.toml"):
        load(tmp_path / "nowhere.toml")


def test_a_directory_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path)


def test_non_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[broker]\nbind = "caf\xe9"\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load(path)


def test_every_broker_key_is_a_field_of_the_config() -> None:
    # The loader's list of keys and the dataclass must not drift apart, or a valid key would crash replace().
    fields = set(BrokerConfig.__dataclass_fields__) - {"topics"}
    assert set(config._BROKER_KEYS) == fields


@pytest.mark.parametrize("key", sorted(config._POSITIVE))
@pytest.mark.parametrize("value", ["0", "-1"])
def test_limits_must_be_positive(tmp_path: Path, key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"{key} must be greater than 0"):
        load(write(tmp_path, f"[broker]\n{key} = {value}\n"))


def test_retention_and_segment_size_are_topic_settings() -> None:
    rule = parse_topic_rule(
        {"pattern": "logs.*", "persistence": "persistent", "sync": "weak", "retention_bytes": 1 << 30,
         "retention_seconds": 86400, "segment_bytes": 1 << 20},
        "topics[0]",
    )
    assert rule.spec.retention_bytes == 1 << 30
    assert rule.spec.retention_seconds == 86400
    assert rule.spec.segment_bytes == 1 << 20


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ({"retention_bytes": 100}, "persistent topics only"),
        ({"persistence": "persistent", "retention_bytes": 0}, "greater than 0"),
        ({"persistence": "persistent", "retention_seconds": "1d"}, "must be a number"),
        ({"persistence": "persistent", "segment_bytes": 10}, "at least 1024"),
        ({"persistence": "persistent", "segment_bytes": True}, "must be an integer"),
    ],
)
def test_bad_retention_settings_are_refused(entry: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_topic_rule({"pattern": "t", **entry}, "topics[0]")


def test_declared_settings_are_read_from_text() -> None:
    spec = declared_spec({"delivery": "round-robin", "persistence": "persistent", "sync": "async",
                          "retention_seconds": "2.5", "max_backlog": "7"})
    assert spec == TopicSpec(Delivery.ROUND_ROBIN, Persistence.PERSISTENT, Sync.ASYNC, max_backlog=7,
                             retention_seconds=2.5)
    with pytest.raises(ConfigError, match="not a number"):
        declared_spec({"persistence": "persistent", "retention_bytes": "lots"})
    with pytest.raises(ConfigError, match="is not one of"):
        declared_spec({"sync": "sometimes", "persistence": "persistent"})


def test_data_dir_and_sync_interval_come_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "mc0.toml"
    path.write_text('[broker]\ndata_dir = "/var/lib/mc0"\nweak_sync_interval = 0.5\n')
    config = load(path)
    assert config.data_dir == Path("/var/lib/mc0")
    assert config.weak_sync_interval == 0.5
    path.write_text("[broker]\nweak_sync_interval = 0\n")
    with pytest.raises(ConfigError, match="greater than 0"):
        load(path)


@pytest.mark.parametrize(
    ("text", "address"),
    [("127.0.0.1:61617", ("127.0.0.1", 61617)), ("0.0.0.0:0", ("0.0.0.0", 0)), ("[::1]:9", ("::1", 9)),
     ("localhost:1", ("localhost", 1)), ("off", None), ("OFF", None),
     ("61617", ("127.0.0.1", 61617)), ("tcp://0.0.0.0:61617", ("0.0.0.0", 61617))],
)
def test_gateway_addresses(text: str, address: tuple[str, int] | None) -> None:
    assert config.listen_address(text, "sexp") == address
    assert BrokerConfig(sexp=text).gateway_address("sexp") == address


@pytest.mark.parametrize(
    ("text", "endpoint"),
    [("61700", "tcp://*:61700"), ("127.0.0.1:61700", "tcp://127.0.0.1:61700"), ("tcp://*:61616", "tcp://*:61616"),
     ("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"), ("[::1]:5", "tcp://[::1]:5"), ("ipc:///tmp/mc0", "ipc:///tmp/mc0")],
)
def test_the_bind_address_is_read_in_every_spelling(tmp_path: Path, text: str, endpoint: str) -> None:
    assert config.bind_endpoint(text) == endpoint
    assert load(write(tmp_path, f"[broker]\nbind = '{text}'\n")).bind == endpoint


def test_the_sexp_gateway_is_on_by_default_on_loopback() -> None:
    assert DEFAULTS.gateway_address("sexp") == ("127.0.0.1", 61617)
    assert DEFAULTS.sexp_ping_interval == 50.0


def test_element_size_from_a_rule_and_a_declare() -> None:
    rule = parse_topic_rule({"pattern": "ticks", "element_size": 8}, "t")
    assert rule.spec.element_size == 8
    assert declared_spec({"element_size": "16"}).element_size == 16
    assert rule.spec.describe()["element_size"] == 8


# -------------------------------------------------------------------------------------- monitoring endpoint


def test_the_monitoring_endpoint_is_on_by_default_on_loopback() -> None:
    assert DEFAULTS.http is None  # not given: the default address, only if its port is free
    assert DEFAULTS.http_address == ("127.0.0.1", 8222)
    assert DEFAULTS.http_topic_labels == 100


def test_monitoring_settings_from_the_file(tmp_path: Path) -> None:
    loaded = load(write(tmp_path, "[broker]\nhttp = '0.0.0.0:9090'\nhttp_topic_labels = 0\n"))
    assert loaded.http == "0.0.0.0:9090"
    assert loaded.http_address == ("0.0.0.0", 9090)
    assert loaded.http_topic_labels == 0
    assert load(write(tmp_path, "[broker]\nhttp = 'off'\n")).http_address is None


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[broker]\nhttp = 'eighty'\n", "[broker].http: 'eighty' is not an address; use HOST:PORT"),
        ("[broker]\nhttp = 8222\n", "[broker].http has the wrong type"),
        ("[broker]\nhttp_topic_labels = -1\n",
         "[broker].http_topic_labels must be 0 (no topic labels) or more"),
        ("[broker]\nhttp_topic_labels = true\n", "[broker].http_topic_labels has the wrong type"),
    ],
)
def test_bad_monitoring_settings_are_refused(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")):
        load(write(tmp_path, text))


# --------------------------------------------------------------------------------------- default topic rules


def test_durable_topics_and_the_lumberjack_topic_are_persistent_and_strong_by_default() -> None:
    rules = DEFAULTS.topic_rules()
    for name in (b"durable.orders", b"durable.", b"logs"):
        spec = rules.spec_for(name)
        assert (spec.persistence, spec.sync) == (Persistence.PERSISTENT, Sync.STRONG), name
    for name in (b"orders", b"durable", b"logs.web", b"xdurable.orders"):
        assert not rules.spec_for(name).persistent, name


def test_a_configured_rule_comes_before_the_defaults(tmp_path: Path) -> None:
    loaded = load(write(tmp_path, "[[topics]]\npattern = 'logs'\npersistence = 'transient'\n"
                                  "[[topics]]\npattern = 'durable.cache.*'\npersistence = 'persistent'\n"
                                  "sync = 'async'\n"))
    rules = loaded.topic_rules()
    assert not rules.spec_for(b"logs").persistent
    assert rules.spec_for(b"durable.cache.x").sync is Sync.ASYNC
    assert rules.spec_for(b"durable.other").sync is Sync.STRONG


def test_the_lumberjack_topic_rule_follows_its_name_literally() -> None:
    rules = BrokerConfig(lumberjack_topic="ship[ped]*").topic_rules()
    assert rules.spec_for(b"ship[ped]*").persistent
    assert not rules.spec_for(b"shipped").persistent, "the topic's name is not a pattern"
    assert not rules.spec_for(b"logs").persistent
