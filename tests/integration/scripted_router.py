"""A stand-in for a broker in the connector's tests: a ZeroMQ ROUTER on loopback whose answers a test
scripts, to put a client through what a real broker does only now and then (a cluster member refusing with
RETRY-AFTER, several commands refused at once)."""

from __future__ import annotations

import threading

import zmq


class LoopbackRouter:
    """A ROUTER on a free loopback port (``port``), served by :meth:`_serve` in a thread of its own until
    :meth:`close`."""

    def __init__(self) -> None:
        self.context = zmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.linger = 0
        self.port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.router.close(linger=0)
        self.context.term()
