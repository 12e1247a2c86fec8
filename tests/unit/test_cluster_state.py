"""The cluster's pure parts (broker/cluster/state.py): the replicated state's commands, the majority
watermark, the up-to-date rule a new leader picks its source by, and where two logs part; and the cluster's
configuration. No processes, no sockets."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any

import pytest

from broker.cluster.raft import _ReplicatedState
from broker.cluster.state import (
    ClusterState,
    ReplicaEnd,
    high_watermark,
    last_epoch,
    majority,
    most_advanced,
    shared_until,
)
from broker.config import DEFAULTS, ConfigError, check_cluster, load, raft_address


def test_majorities() -> None:
    assert [majority(size) for size in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]


@pytest.mark.parametrize(("positions", "size", "watermark"), [
    ([10, 7, 3], 3, 7),  # the second highest of three: on the leader and one follower
    ([10, 7], 3, 7),  # a follower not heard from holds nothing
    ([10], 3, 1),  # the leader alone is no majority
    ([10, 10, 10], 3, 10),
    ([9, 8, 7, 6, 5], 5, 7),
    ([5, 9], 2, 5),  # two brokers: both
])
def test_high_watermark_is_what_a_majority_holds(positions: list[int], size: int, watermark: int) -> None:
    assert high_watermark(positions, size) == watermark


def test_commands_apply_in_order_and_a_stale_take_over_changes_nothing() -> None:
    state = ClusterState()
    assert state.apply(("join", "a:1", "tcp://a:2"))
    assert state.apply(("topic", b"t".hex(), {"sync": "strong"}))
    assert state.apply(("take_over", "a:1", 1, {b"t".hex(): ("i1", ())}))
    assert (state.epoch, state.leader) == (1, "a:1")
    assert not state.apply(("take_over", "b:1", 1, {}))  # epoch 1 is taken
    assert state.leader == "a:1"
    assert not state.apply(("take_over", "b:1", 3, {}))  # an epoch is never skipped
    assert state.apply(("take_over", "b:1", 2, {b"t".hex(): ("i2", (("i1", 40),))}))
    assert state.epoch_of(b"t".hex(), "i1") == 1
    assert state.epoch_of(b"t".hex(), "i2") == 2
    assert state.epoch_of(b"t".hex(), "unknown") == 0
    assert state.apply(("positions", "a:1", {b"t".hex(): 41}))
    assert state.positions == {"a:1": {b"t".hex(): 41}}
    assert state.apply(("acked", {b"t".hex(): ("i2", 30)}))
    assert state.apply(("acked", {b"t".hex(): ("i2", 35)}))  # the latest report is the position
    assert state.acked == {b"t".hex(): ("i2", 35)}
    assert state.unwritable_epoch == 0
    assert state.apply(("unwritable", 2))  # epoch 2's leader handed over: it could not write
    assert state.apply(("unwritable", 1))  # applied again from an older entry: the latest stands
    assert state.unwritable_epoch == 2
    with pytest.raises(ValueError, match="unknown cluster command"):
        state.apply(("nonsense",))
    assert state.apply(("forget_topic", b"t".hex(), "i2"))  # deleted: nothing of it stays
    assert (state.topics, state.identities, state.acked) == ({}, {}, {})
    assert state.positions == {"a:1": {}}


def test_a_dump_from_before_a_field_loads_with_its_default() -> None:
    """PySyncObj pickles the state into its dump: one written by an older broker lacks the newer fields."""
    state = ClusterState(epoch=4, leader="a:1")
    old = pickle.dumps(state)
    del state.__dict__["acked"]  # as an older broker's state had it
    older = pickle.loads(pickle.dumps(state))
    assert older.acked == {}
    assert older.epoch == 4
    assert pickle.loads(old) == ClusterState(epoch=4, leader="a:1")


def test_identities_per_topic_are_bounded() -> None:
    state = ClusterState()
    for epoch in range(1, 40):
        state.apply(("take_over", "a:1", epoch, {"74": (f"i{epoch}", ())}))
    assert len(state.identities["74"]) == 16
    assert state.identities["74"][-1][1] == "i39"


EPOCHS = {"old": 1, "new": 2}.get


def epoch_of(incarnation: str) -> int:
    return EPOCHS(incarnation, 0)


def test_last_epoch_is_the_epoch_of_the_last_message() -> None:
    # Took epoch 2's identity (whose leader took over at id 10) but holds only ids below 10: last epoch 1.
    assert last_epoch(ReplicaEnd("a", 4, "new", (("old", 10),)), epoch_of) == 1
    assert last_epoch(ReplicaEnd("a", 11, "new", (("old", 10),)), epoch_of) == 2
    assert last_epoch(ReplicaEnd("a", 1, "new", (("old", 10),)), epoch_of) == 0  # empty
    assert last_epoch(ReplicaEnd("a", 30, "old"), epoch_of) == 1


def test_the_up_to_date_replica_wins_over_the_longer_one() -> None:
    # An old leader wrote ids 10..20 alone in epoch 1; epoch 2's leader wrote 10..15 on a majority.
    stale = ReplicaEnd("stale", 21, "old")
    current = ReplicaEnd("current", 16, "new", (("old", 10),))
    assert most_advanced([stale, current], epoch_of) is current
    # A copy that took the new identity but holds only old messages is not ahead of an old log that is
    # longer: the last message's epoch decides, then the length.
    short = ReplicaEnd("short", 4, "new", (("old", 10),))
    longer = ReplicaEnd("longer", 10, "old")
    assert most_advanced([short, longer], epoch_of) is longer
    with pytest.raises(ValueError, match="no replica"):
        most_advanced([], epoch_of)


def test_where_two_logs_part() -> None:
    mine = ReplicaEnd("me", 21, "old")
    theirs = ReplicaEnd("them", 16, "new", (("old", 10),))
    assert shared_until(mine, theirs) == 10  # my 10..20 is not theirs: cut there
    assert shared_until(ReplicaEnd("me", 8, "old"), theirs) == 8  # all of mine is theirs
    assert shared_until(ReplicaEnd("me", 5, "same"), ReplicaEnd("them", 9, "same")) == 5
    assert shared_until(ReplicaEnd("me", 5, "x"), ReplicaEnd("them", 9, "y")) == 1  # unrelated logs
    # Mine descends from theirs: we share what they held below where mine took over.
    assert shared_until(ReplicaEnd("me", 30, "new", (("old", 10),)), ReplicaEnd("them", 12, "old")) == 10


def test_two_logs_that_each_took_a_new_identity_from_one_log_share_it() -> None:
    # Both took an identity from "a": mine at 14 (a take-over Raft did not accept), theirs at 10 (the one it
    # did). Neither knows the other's identity; both hold a's messages below 10.
    mine = ReplicaEnd("me", 20, "mine", (("a", 14),))
    theirs = ReplicaEnd("them", 25, "theirs", (("a", 10),))
    assert shared_until(mine, theirs) == 10
    assert shared_until(theirs, mine) == 10
    # Deeper: the latest shared ancestor decides, bounded by every later "until" on either side.
    mine = ReplicaEnd("me", 40, "m2", (("root", 5), ("b", 30), ("m1", 35)))
    theirs = ReplicaEnd("them", 50, "t1", (("root", 5), ("b", 22)))
    assert shared_until(mine, theirs) == 22
    assert shared_until(ReplicaEnd("me", 18, "m1", (("b", 30),)), theirs) == 18  # mine is shorter still
    # An ancestor's messages end where a later identity of the same log cut them.
    mine = ReplicaEnd("me", 40, "m2", (("b", 30), ("m1", 12)))
    assert shared_until(mine, theirs) == 12
    # A lineage that forgot the shared ancestor shares nothing that can be shown.
    assert shared_until(ReplicaEnd("me", 40, "m2", (("m1", 35),)), theirs) == 1


def test_cluster_settings_load_and_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "mc0.toml"
    path.write_text('[broker]\ncluster_node = "127.0.0.1:7001"\ncluster_peers = ["127.0.0.1:7002", '
                    '"localhost:7003"]\nadvertise = "10.0.0.1:61616"\ncluster_commit_timeout = 2.5\n')
    config = load(path)
    assert config.clustered
    assert config.cluster_peers == ("127.0.0.1:7002", "localhost:7003")
    assert config.advertised("tcp://*:61616") == "tcp://10.0.0.1:61616"
    check_cluster(config)
    assert not DEFAULTS.clustered  # no cluster without cluster_node: a single broker as before
    check_cluster(DEFAULTS)
    # Without CURVE: on loopback to try it out, or anywhere with a secret.
    path.write_text('[broker]\ncurve = false\ncluster_node = "127.0.0.1:7001"\n'
                    'cluster_peers = ["[::1]:7002"]\n')
    check_cluster(load(path))
    path.write_text('[broker]\ncurve = false\ncluster_node = "10.0.0.1:7001"\n'
                    'cluster_peers = ["10.0.0.2:7001"]\ncluster_secret = "long and random"\n')
    check_cluster(load(path))


@pytest.mark.parametrize(("text", "fragment"), [
    ('cluster_peers = ["127.0.0.1:7002"]\n', "cluster_node is not"),
    ('cluster_node = "127.0.0.1:7001"\n', "cluster_peers is empty"),
    ('cluster_node = "127.0.0.1:7001"\ncluster_peers = ["127.0.0.1:7001"]\n', "own address"),
    ('cluster_node = "127.0.0.1:0"\ncluster_peers = ["127.0.0.1:7002"]\n', "fixed port"),
    ('cluster_node = "nowhere"\ncluster_peers = ["127.0.0.1:7002"]\n', "not an address"),
    ('cluster_peers = [1]\n', "list of HOST:PORT"),
    ('cluster_commit_timeout = 0\n', "greater than 0"),
    ('curve = false\ncluster_node = "10.0.0.1:7001"\ncluster_peers = ["10.0.0.2:7001"]\n', "unauthenticated"),
    ('curve = false\ncluster_node = "broker1:7001"\ncluster_peers = ["broker2:7001"]\n', "turn CURVE on"),
])
def test_bad_cluster_settings_are_refused_in_one_line(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "mc0.toml"
    path.write_text("[broker]\n" + text)
    with pytest.raises(ConfigError) as refused:
        check_cluster(load(path))
    assert fragment in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_broker_bound_everywhere_must_say_where_it_is_reached() -> None:
    with pytest.raises(ConfigError, match="advertise"):
        DEFAULTS.replace(cluster_node="127.0.0.1:7001").advertised("tcp://*:61616")
    assert raft_address("[::1]:7001", "x") == "[::1]:7001"


def test_a_command_of_a_newer_broker_is_passed_over_once_said(caplog: pytest.LogCaptureFixture) -> None:
    """In a rolling upgrade a newer leader may submit a kind of command this broker does not know: its Raft
    passes it over (saying so once per kind) instead of stopping, and applies the ones it knows."""
    applied: list[tuple[Any, ...]] = []
    replicated = _ReplicatedState(lambda command, state: applied.append(command))
    with caplog.at_level(logging.WARNING, logger="mc0.cluster"):
        assert replicated.command(("from_the_future", 1), _doApply=True) is False
        assert replicated.command(("from_the_future", 2), _doApply=True) is False
        assert replicated.command(("join", "a:1", "tcp://a:2"), _doApply=True) is True
    assert applied == [("join", "a:1", "tcp://a:2")]
    assert replicated.state.endpoints == {"a:1": "tcp://a:2"}
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == 1
    assert "does not know" in said[0]
