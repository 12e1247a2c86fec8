"""The ``mc0`` data source's options, checked without Spark: names (case-insensitive, the nearest suggested,
a near miss of a refused Kafka name with the reason), modes, Kafka's refused with a reason, values (flags,
counts, durations, Kafka's offsets JSON), and the options table of docs/pipeline.md against the code and
against every option of Spark's Kafka source and sink."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline import options
from pipeline.options import Mode, OptionError


def test_known_options_pass_in_their_modes_whatever_their_case() -> None:
    options.check({"subscribe": "a", "STARTINGOFFSETS": "earliest", "maxoffsetspertrigger": "5"}, Mode.STREAM)
    options.check({"topic": "t", "checkpointlocation": "checkpoints/c"}, Mode.WRITE_STREAM)
    options.check({"writeid": "w1", "broker": "tcp://h:1"}, Mode.WRITE)


@pytest.mark.parametrize("mode", [Mode.WRITE, Mode.WRITE_STREAM])
def test_include_headers_is_accepted_on_writes_as_kafkas_sink_accepts_it(mode: Mode) -> None:
    from pyspark.sql.types import BinaryType, StructField, StructType

    from pipeline.sink import WriteSettings
    from pipeline.source import HEADERS_TYPE

    options.check({"includeHeaders": "true", "topic": "t"}, mode)
    schema = StructType([StructField("value", BinaryType()), StructField("headers", HEADERS_TYPE)])
    for given in ("true", "false"):
        settings = WriteSettings.parse({"includeHeaders": given, "topic": "t"}, schema, mode)
        assert settings.headers_column == "array", "a headers column is written either way"
    with pytest.raises(OptionError, match="includeHeaders must be true or false"):
        WriteSettings.parse({"includeHeaders": "yes", "topic": "t"}, schema, mode)


@pytest.mark.parametrize(
    ("given", "mode", "says"),
    [
        ({"maxOffsetPerTrigger": "5"}, Mode.STREAM, "did you mean maxOffsetsPerTrigger"),
        ({"failondataloos": "false"}, Mode.READ, "did you mean failOnDataLoss"),
        ({"endingOffsets": "latest"}, Mode.STREAM, "applies to batch reads (spark.read), not to streaming"),
        ({"topic": "t"}, Mode.READ, "applies to batch writes"),
        ({"assign": "{}"}, Mode.READ, "no partitions"),
        ({"kafka.bootstrap.servers": "k:9092"}, Mode.WRITE, "mc0 is not Kafka"),
        ({"groupIdPrefix": "g"}, Mode.STREAM, "consumer group"),
        ({"kafka.group.id": "g"}, Mode.STREAM, "kafka.group.id is not supported by format mc0: reads use no "
                                               "consumer group"),
        ({"KAFKA.GROUP.ID": "g"}, Mode.READ, "reads use no consumer group"),
        ({"kafka.group.instance.id": "g"}, Mode.READ, "mc0 is not Kafka"),
        ({"kafkaConsumer.pollTimeout": "5"}, Mode.READ,
         "unknown option kafkaConsumer.pollTimeout for format mc0: did you mean kafkaConsumer.pollTimeoutMs? "
         "format mc0 does not support it: use requestTimeoutMs"),
        ({"assignn": "{}"}, Mode.STREAM,
         "did you mean assign? format mc0 does not support it: mc0 topics have no partitions"),
        ({"groupIdPrefx": "g"}, None, "did you mean groupIdPrefix? format mc0 does not support it: reads use "
                                      "no consumer group"),
        ({"fetchOffset.numRetry": "3"}, Mode.READ, "did you mean fetchOffset.numRetries?"),
        ({"path": "/x"}, Mode.WRITE, "not paths"),
        ({"checkpointLocation": "/c"}, Mode.WRITE, "unknown option"),
        ({"zzz": "1"}, None, "the options are broker"),
    ],
)
def test_what_does_not_apply_is_an_error_that_says_why(given: dict[str, str], mode: Mode | None,
                                                       says: str) -> None:
    with pytest.raises(OptionError, match=None) as info:
        options.check(given, mode)
    assert says in str(info.value)
    assert "\n" not in str(info.value), "one line"


def test_values_are_checked() -> None:
    assert options.flag({"x": " TRUE "}, "x", False) is True
    with pytest.raises(OptionError, match="true or false"):
        options.flag({"x": "yes"}, "x", False)
    assert options.count({"n": "7"}, "n") == 7
    with pytest.raises(OptionError, match="at least 1"):
        options.count({"n": "0"}, "n")
    assert [options.duration_ms({"d": text}, "d", "1s") for text in ("500ms", "30s", "15m", "1h", "250")] == [
        500, 30_000, 900_000, 3_600_000, 250]
    with pytest.raises(OptionError, match="duration"):
        options.duration_ms({"d": "soon"}, "d", "1s")


def test_offsets_json_in_our_form_or_kafkas() -> None:
    assert options.topics_json('{"a": 3, "b": {"0": -2}}', "startingOffsets") == {"a": 3, "b": -2}
    for bad, says in (('{"a": {"1": 3}}', "no partitions"), ("[1]", "JSON object"), ("{", "JSON object"),
                      ('{"a": "3"}', "integer")):
        with pytest.raises(OptionError) as info:
            options.topics_json(bad, "startingOffsets")
        assert says in str(info.value)


def test_z85_keys_go_together() -> None:
    with pytest.raises(OptionError, match="go together"):
        options.Connection.parse({"serverKey": "x"})
    connection = options.Connection.parse({"connectTimeoutMs": "1500"})
    assert (connection.broker, connection.connect_timeout, connection.request_timeout) == (
        options.DEFAULT_BROKER, 1.5, options.DEFAULT_REQUEST_TIMEOUT_MS / 1000)


# ------------------------------------------------------------------------------- a schema given to a read


def test_a_given_schema_chooses_columns_in_its_order_and_the_full_one_chooses_none() -> None:
    from pyspark.sql.types import StructType

    from pipeline.source import SCHEMA, SCHEMA_WITH_HEADERS, chosen_columns

    assert chosen_columns(SCHEMA, SCHEMA) is None
    chosen = StructType([SCHEMA_WITH_HEADERS["headers"], SCHEMA["id"]])
    assert chosen_columns(chosen, SCHEMA_WITH_HEADERS) == chosen
    assert chosen_columns(StructType(list(reversed(SCHEMA.fields))), SCHEMA) is not None


def refused_schemas() -> list[tuple[list, str]]:
    from pyspark.sql.types import BinaryType, IntegerType, StructField

    from pipeline.source import HEADERS_TYPE

    return [
        ([StructField("value", BinaryType()), StructField("value", BinaryType())], "names a column twice"),
        ([StructField("id", IntegerType())], "column 'id' of an mc0 read is bigint, not int"),
        ([StructField("partition", IntegerType())],
         "column 'partition' of the given schema is not one an mc0 read has: choose among key binary"),
        ([StructField("headers", HEADERS_TYPE)], "headers needs includeHeaders=true"),
    ]


@pytest.mark.parametrize(("fields", "says"), refused_schemas())
def test_a_given_schema_with_other_columns_or_types_is_refused(fields: list, says: str) -> None:
    from pyspark.sql.types import StructType

    from pipeline.source import SCHEMA, chosen_columns

    with pytest.raises(OptionError, match=says):
        chosen_columns(StructType(fields), SCHEMA)


def test_a_given_schema_without_columns_is_refused() -> None:
    from pyspark.sql.types import StructType

    from pipeline.source import SCHEMA, chosen_columns

    with pytest.raises(OptionError, match="at least one column"):
        chosen_columns(StructType([]), SCHEMA)


# ------------------------------------------------------------------------------ the table in the docs

#: Every option of Spark's Kafka source and sink (Spark's Structured Streaming + Kafka Integration Guide):
#: each must be supported, or refused with a reason, and be in docs/pipeline.md's table as such.
KAFKA_SOURCE_OPTIONS = (
    "assign", "subscribe", "subscribePattern", "kafka.bootstrap.servers", "startingTimestamp",
    "startingOffsetsByTimestamp", "startingOffsets", "endingTimestamp", "endingOffsetsByTimestamp",
    "endingOffsets", "failOnDataLoss", "kafkaConsumer.pollTimeoutMs", "fetchOffset.numRetries",
    "fetchOffset.retryIntervalMs", "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
    "minPartitions", "maxRecordsPerPartition", "groupIdPrefix", "kafka.group.id", "includeHeaders",
    "startingOffsetsByTimestampStrategy",
)
KAFKA_SINK_OPTIONS = ("kafka.bootstrap.servers", "topic", "includeHeaders")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "pipeline.md"
#: The "where" column of the table, for each set of modes.
WHERE = {
    options.EVERY: "all",
    options.READS: "reads",
    options.WRITES: "writes",
    frozenset({Mode.READ}): "batch reads",
    frozenset({Mode.STREAM}): "streams",
    frozenset({Mode.WRITE}): "batch writes",
}


def docs_table() -> dict[str, tuple[str, str]]:
    """docs/pipeline.md's options table: option name -> (where, supported / refused / ours)."""
    text = DOCS.read_text()
    table = text[text.index("| option | where | mc0 |"):]
    table = table[:table.index("\n\n")]
    out = {}
    for line in table.splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        for name in re.findall(r"`([^`]+)`", cells[0]):
            out[name] = (cells[1], cells[2])
    return out


def test_every_kafka_option_is_supported_or_refused_and_in_the_docs_table_as_it_is() -> None:
    table = docs_table()
    known = {option.name: option for option in options.OPTIONS}
    for name in sorted(set(KAFKA_SOURCE_OPTIONS) | set(KAFKA_SINK_OPTIONS)):
        if name in known:
            assert known[name].kafka, f"{name} is Kafka's name"
            assert table.get(name, ("", ""))[1] == "supported", f"{name}: supported in the docs table"
        else:
            with pytest.raises(OptionError, match=r"is not supported by format mc0: .+"):
                options.check({name: "x"}, None)
            assert table.get(name, ("", ""))[1] == "refused", f"{name}: refused in the docs table"
    for name in KAFKA_SINK_OPTIONS:
        if name in known:
            assert known[name].modes & options.WRITES, f"Kafka's sink takes {name}"


def test_the_docs_table_lists_every_option_where_it_applies() -> None:
    table = docs_table()
    for option in options.OPTIONS:
        assert option.name in table, f"{option.name} is missing from docs/pipeline.md's options table"
        where, status = table[option.name]
        assert status == ("supported" if option.kafka else "ours"), option.name
        assert where == WHERE[option.modes], f"{option.name} applies to {WHERE[option.modes]}, not {where}"
    for name in options.REFUSED:
        assert table.get(name, ("", ""))[1] == "refused", f"{name}: refused in the docs table"
