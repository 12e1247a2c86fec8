"""A cluster of brokers: replicated persistent topics and automatic failover.

Several brokers started with the same peer list form a cluster. This package owns everything that makes them
one: consensus through PySyncObj's Raft (``raft.py``: membership, leader election, and the small replicated
state of ``state.py``: the leader epoch, which broker leads and where, the persistent topics' settings and
log identities, each replica's durable position), the pure rules of the majority and of failover
(``state.py``), the mc0 links between brokers (``link.py``), the followers' copy of the leader's logs
(``replicator.py``), and this broker's role and its decisions (``node.py``).

What it must not know: the engine's and the store's internals (it uses their hooks: ``Engine.gate``,
``Engine.release``, ``Engine.append_replicated``, ``Engine.truncate``, ``FileStore.set_identity``), the
other doors, and the wire beyond ``protocol.mc0``. Nothing here runs on a broker without ``cluster_node``: a
single broker is exactly what it was. docs/cluster.md describes the model and its promises.
"""
