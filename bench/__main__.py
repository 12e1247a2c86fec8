"""``python -m bench``: mc0 against libzmq's C proxy and a plain Python forwarder, same clients, same run.

Prints deliveries per second for 1 → 1, 1 → 4 fan-out and 1 → 2 round-robin with 100-byte messages,
and one-way latency (p50/p99) at a paced 1,000 msg/s, each with mc0's ratio against both baselines; the
latency also with ``connector.AsyncClient`` on both ends (``async`` rows), which has no thread between the
caller and the socket.
The target for the foundation: mc0 at least 1.0 times the libzmq proxy on 1 → 1.

``python -m bench durability [options]`` runs the durability benchmark instead (see ``bench/durability.py``):
confirmed publishes per sync level against transient, and replay from the log against live delivery.

``python -m bench gateways [options]`` measures the TCP doors: an mc0 publisher with its subscribers on a
gateway, against the same publisher with mc0 subscribers, same run (see ``bench/gateways.py``).

``python -m bench lumberjack [options]``: events/s shipped over Lumberjack into a strong topic in batches of
2,048, next to the same events published over mc0, same run; then a window routed to hundreds of new topics,
and what it costs another client meanwhile (see ``bench/lumberjack.py``).

``python -m bench cost [options]``: what one message costs outside a flood: confirmed publishes to a strong
topic 1 and 100 in flight against a plain Python ROUTER that only answers OK, and Lumberjack one-event batches
written in two sends (see ``bench/cost.py``).

``python -m bench spark [options]``: a topic of 1,000,000 messages counted by Spark through the ``mc0`` data
source, next to the connector reading it in one process, same run (see ``bench/spark.py``).

``python -m bench monitoring [options]``: what a scrape of the monitoring endpoint costs the broker's loop
with 10,000 topics, against no scraping, same run (see ``bench/monitoring.py``).

``python -m bench cluster [options]``: confirmed publishes to a strong topic on a three-broker cluster against
a single broker, same run, and failover times (see ``bench/cluster.py``).

``python -m bench faults [--soak N]``: what clients can do to a broker, and that it still answers afterwards
(see ``bench/faults.py``; ``tests/faults/`` runs the same scenarios in CI).
"""

from __future__ import annotations

import argparse
import platform
import sys

import zmq

from bench.process import choose_engine, choose_event_loop
from bench.throughput import median_cases

SYSTEMS = ("zmq-proxy", "py-forwarder", "mc0")
#: One-way latency at a paced 1,000 msg/s: p50 at most this many times the libzmq proxy's (NATS sits at 1.7 to
#: 2.2 times it on these machines), and the broker's CPU per message (every thread) at most this.
LATENCY_TARGET = 1.5
CPU_TARGET_US = 100


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["durability"]:
        from bench import durability

        return durability.main(argv[1:])
    if argv[:1] == ["gateways"]:
        from bench import gateways

        return gateways.main(argv[1:])
    if argv[:1] == ["lumberjack"]:
        from bench import lumberjack

        return lumberjack.main(argv[1:])
    if argv[:1] == ["cost"]:
        from bench import cost

        return cost.main(argv[1:])
    if argv[:1] == ["spark"]:
        from bench import spark

        return spark.main(argv[1:])
    if argv[:1] == ["monitoring"]:
        from bench import monitoring

        return monitoring.main(argv[1:])
    if argv[:1] == ["faults"]:
        from bench import faults

        return faults.main(argv[1:])
    if argv[:1] == ["cluster"]:
        from bench import cluster

        return cluster.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     epilog="python -m bench durability --help: the durability benchmark")
    parser.add_argument("--messages", type=int, default=200_000, help="messages per throughput run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the median is reported")
    parser.add_argument("--latency-seconds", type=float, default=3.0, help="length of the paced latency run")
    parser.add_argument("--event-loop", choices=("auto", "uvloop", "asyncio"),
                        help="mc0's event loop (default: the broker's own default, auto)")
    parser.add_argument("--mc0-engine", choices=("auto", "native", "zeromq"),
                        help="what serves mc0's port (default: the broker's own default, auto: native)")
    args = parser.parse_args(argv)
    choose_event_loop(args.event_loop)
    choose_engine(args.mc0_engine)

    print(f"python {platform.python_version()}, pyzmq {zmq.pyzmq_version()}, libzmq {zmq.zmq_version()}, "
          f"{args.messages:,} x {100}-byte messages, median of {args.repeat}, interleaved")
    scenarios = [
        ("1 -> 1", "broadcast", 1, args.messages, 0.0),
        ("1 -> 4 fan-out", "broadcast", 4, args.messages // 2, 0.0),
        ("1 -> 2 round-robin", "round-robin", 2, args.messages, 0.0),
        ("latency @1000/s", "broadcast", 1, int(1000 * args.latency_seconds), 1000.0),
    ]
    columns = "".join(f"{s:>14}" for s in SYSTEMS)
    header = f"{'scenario':<30}{columns}{'mc0/zmq-proxy':>15}{'mc0/py-fwd':>12}"
    print("msg/s: higher is better; us: lower is better (a ratio above 1 there means mc0 is slower)")
    print(header)
    print("-" * len(header))
    targets: list[tuple[str, bool]] = []
    for name, mode, subscribers, messages, rate in scenarios:
        # The paced case also runs mc0 with connector.AsyncClient on both ends (no thread between caller and
        # socket), through libzmq and on its native wire, interleaved with the others.
        systems = (*SYSTEMS, "mc0-async", "mc0-native") if rate else SYSTEMS
        results = median_cases(systems, mode, subscribers, messages, args.repeat, rate)
        if rate:
            # Lower is better here: a ratio above 1 means mc0 is slower or costlier than the baseline.
            for label, attr in (("p50 us", "p50_us"), ("p99 us", "p99_us"), ("cpu us/msg", "cpu_us")):
                row = [getattr(results[s], attr) for s in SYSTEMS]
                if None in row:
                    continue  # no CPU figures on this platform
                print(f"{name + ' ' + label:<30}" + "".join(f"{v:>14,.0f}" for v in row)
                      + f"{row[2] / row[0]:>15.2f}{row[2] / row[1]:>12.2f}")
            aio, native = results["mc0-async"], results["mc0-native"]
            for system, suffix in ((aio, "async"), (native, "native")):
                for label, attr in (("p50 us", "p50_us"), ("p99 us", "p99_us")):
                    value, proxy, forwarder = (getattr(r, attr) for r in (system, results["zmq-proxy"],
                                                                          results["py-forwarder"]))
                    print(f"{name + ' ' + label + ', ' + suffix:<30}{'':>28}{value:>14,.0f}"
                          f"{value / proxy:>15.2f}{value / forwarder:>12.2f}")
            p50 = [results[s].p50_us for s in SYSTEMS]
            targets.append((f"latency p50 <= {LATENCY_TARGET} x zmq-proxy ({p50[2] / p50[0]:.2f}; "
                            f"with AsyncClient {aio.p50_us / p50[0]:.2f}, on its native wire "
                            f"{native.p50_us / p50[0]:.2f})",
                            p50[2] <= LATENCY_TARGET * p50[0]))
            targets.append((f"latency p50 with AsyncClient's native wire <= {LATENCY_TARGET} x zmq-proxy "
                            f"({native.p50_us / p50[0]:.2f})", native.p50_us <= LATENCY_TARGET * p50[0]))
            cpu = results["mc0"].cpu_us
            if cpu is not None:
                targets.append((f"mc0 CPU per message at 1,000/s <= {CPU_TARGET_US} us ({cpu:.0f})",
                                cpu <= CPU_TARGET_US))
            continue
        row = [results[s].rate for s in SYSTEMS]
        lost = {s: results[s].expected - results[s].delivered for s in SYSTEMS if results[s].delivered
                < results[s].expected}
        print(f"{name + ' msg/s':<30}" + "".join(f"{v:>14,.0f}" for v in row)
              + f"{row[2] / row[0]:>15.2f}{row[2] / row[1]:>12.2f}"
              + (f"   lost: {lost}" if lost else ""))
        if name == "1 -> 1":
            targets.append((f"1 -> 1 >= 1.0 x zmq-proxy ({row[2] / row[0]:.2f})", row[2] >= row[0]))
    print()
    for what, met in targets:
        print(f"target {what}: {'met' if met else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
