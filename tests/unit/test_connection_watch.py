"""The connector's reading of its socket's monitor events (connector/connection.py), event by event, with
time as an argument: the sequences libzmq 4.3 produced for each case (recorded against a real broker)."""

from __future__ import annotations

import pytest
import zmq

from connector.connection import (
    GREETING_OPENING,
    MISMATCH,
    NO_DETAIL_TIMES,
    REFUSED_FOR,
    REFUSED_FOR_MOVING,
    AskMechanism,
    ConnectionWatch,
    Reconnected,
    Unreachable,
    greeting_mechanism,
)

ENDPOINT = "tcp://127.0.0.1:5555"
KEY = b"rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"


def watch(curve: bool = True) -> ConnectionWatch:
    return ConnectionWatch(ENDPOINT, curve_public=KEY if curve else None)


def feed(target: ConnectionWatch, *events: tuple[int, int, float]) -> list[object]:
    return [target.event(kind, value, now) for kind, value, now in events]


def test_a_handshake_then_nothing_else_is_quiet() -> None:
    target = watch()
    events = (zmq.EVENT_CONNECTED, 5, 0.0), (zmq.EVENT_HANDSHAKE_SUCCEEDED, 0, 0.01)
    assert feed(target, *events) == [None, None]
    assert target.connected
    assert target.check(10.0) is None


def test_connects_refused_for_a_second_mean_nothing_listens() -> None:
    target = watch()
    assert target.event(zmq.EVENT_CONNECT_RETRIED, 100, 0.0) is None
    assert target.check(REFUSED_FOR / 2) is None  # a broker that is starting gets its second
    verdict = target.check(REFUSED_FOR)
    assert isinstance(verdict, Unreachable)
    assert verdict.reason == (f"nothing is listening at {ENDPOINT}: start the broker (mc0 broker), or check "
                              "the address")


def test_something_listening_resets_the_refusals() -> None:
    target = watch()
    target.event(zmq.EVENT_CONNECT_RETRIED, 100, 0.0)
    target.event(zmq.EVENT_CONNECTED, 5, 0.5)
    assert target.check(5.0) is None


def test_a_refused_key_says_which_key_and_how_to_admit_it() -> None:
    verdict = watch().event(zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400, 0.0)
    assert isinstance(verdict, Unreachable)
    key = KEY.decode()
    assert verdict.reason == (f"the broker at {ENDPOINT} refused this client's key {key} (ZAP status 400): "
                              f"admit it on the broker with `mc0 keys admit NAME {key}`")


def test_curve_on_one_side_only() -> None:
    mismatch = (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, MISMATCH, 0.1)
    curve_client = watch(curve=True).event(*mismatch)
    plain_client = watch(curve=False).event(*mismatch)
    assert isinstance(curve_client, Unreachable)
    assert "does not speak CURVE (it runs with --no-curve)" in curve_client.reason
    assert isinstance(plain_client, Unreachable)
    assert "requires CURVE" in plain_client.reason


def test_a_mismatch_after_failures_without_detail_is_still_told_as_a_mismatch() -> None:
    """libzmq reported failures without detail before the first mismatch (plaintext against CURVE)."""
    target = watch(curve=False)
    failures = [(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 32, n / 10) for n in range(2)]
    assert feed(target, *failures) == [None, None]
    verdict = target.event(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, MISMATCH, 0.4)
    assert isinstance(verdict, Unreachable)
    assert "requires CURVE" in verdict.reason


def test_failures_without_detail_make_the_client_ask_the_broker_once() -> None:
    target = watch()
    failures = [(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 32, n / 10) for n in range(NO_DETAIL_TIMES + 3)]
    verdicts = feed(target, *failures)
    assert verdicts[: NO_DETAIL_TIMES - 1] == [None] * (NO_DETAIL_TIMES - 1)
    assert isinstance(verdicts[NO_DETAIL_TIMES - 1], AskMechanism)
    assert verdicts[NO_DETAIL_TIMES:] == [None, None, None], "asked once, not at every failure"


@pytest.mark.parametrize(
    ("client_curve", "broker", "fragment"),
    [
        (True, "CURVE", "the broker.key this client pins is most likely not that broker's key"),
        (True, "NULL", "does not speak CURVE (it runs with --no-curve)"),
        (False, "CURVE", "requires CURVE"),
        (False, "NULL", "is it an mc0 broker"),
        (True, None, "is it an mc0 broker"),
    ],
)
def test_what_the_broker_says_it_speaks_decides(
    client_curve: bool, broker: str | None, fragment: str
) -> None:
    verdict = watch(curve=client_curve).mechanism(broker)
    assert fragment in verdict.reason


def test_greetings_are_read_for_their_mechanism() -> None:
    greeting = GREETING_OPENING + b"\x01" + b"CURVE".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31
    assert len(greeting) == 64
    assert greeting_mechanism(greeting) == "CURVE"
    assert greeting_mechanism(greeting[:40]) is None
    assert greeting_mechanism(b"HTTP/1.1 400 Bad Request\r\n" + b"x" * 64) is None


def test_the_connection_coming_back_after_a_loss_is_a_reconnect_and_the_first_is_not() -> None:
    target = watch()
    assert target.event(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0, 0.0) is None
    assert target.event(zmq.EVENT_DISCONNECTED, 5, 1.0) is None
    assert not target.connected
    assert target.event(zmq.EVENT_CONNECT_RETRIED, 100, 1.1) is None
    assert isinstance(target.event(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0, 1.3), Reconnected)
    assert target.connected
    assert target.event(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0, 1.4) is None  # already connected: nothing new


def test_timed_out_says_the_best_that_is_known() -> None:
    assert "no connection to the broker" in watch().timed_out(0.5)
    refused = watch()
    refused.event(zmq.EVENT_CONNECT_RETRIED, 100, 0.0)
    assert refused.timed_out(0.5).startswith("nothing is listening at")
    answered = watch()
    answered.event(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0, 0.0)
    assert "does not answer as an mc0 broker" in answered.timed_out(5)


def test_a_watch_that_may_move_gives_up_on_the_first_refused_connect() -> None:
    target = ConnectionWatch(ENDPOINT, curve_public=None, refused_for=REFUSED_FOR_MOVING)
    (verdict,) = feed(target, (zmq.EVENT_CONNECT_RETRIED, 20, 5.0))
    assert isinstance(verdict, Unreachable)
    assert "nothing is listening" in verdict.reason
    patient = watch(curve=False)
    assert feed(patient, (zmq.EVENT_CONNECT_RETRIED, 20, 5.0)) == [None]
