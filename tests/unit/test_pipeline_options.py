"""The ``mc0`` data source's options, checked without Spark: names (case-insensitive, the nearest suggested,
a near miss of a refused Kafka name with the reason), modes, Kafka's refused with a reason, values (flags,
counts, durations, Kafka's offsets JSON)."""

from __future__ import annotations

import pytest

from pipeline import options
from pipeline.options import Mode, OptionError


def test_known_options_pass_in_their_modes_whatever_their_case() -> None:
    options.check({"subscribe": "a", "STARTINGOFFSETS": "earliest", "maxoffsetspertrigger": "5"}, Mode.STREAM)
    options.check({"topic": "t", "checkpointlocation": "checkpoints/c"}, Mode.WRITE_STREAM)
    options.check({"writeid": "w1", "broker": "tcp://h:1"}, Mode.WRITE)


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
