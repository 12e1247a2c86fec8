"""``python -m bench gateways``: what a TCP door costs next to the mc0 door, measured in the same run.

One mc0 publisher (the connector's ``Client``) sends 100-byte messages to a broadcast topic; the subscribers
read them either over mc0 (the connector) or over a gateway with that dialect's client from ``connector/``.
The figure is deliveries per second at the subscribers, and its ratio against mc0 subscribers of the same
broker build, 1 → 1 and 1 → 4 fan-out, median of ``--repeat`` runs, interleaved (every system's first run,
then every system's second, ...).
"""

from __future__ import annotations

import argparse
import platform

from bench.process import choose_event_loop
from bench.throughput import BODY_SIZE, median_cases

#: Gateway systems of bench.throughput, by door.
DOORS = {"sexp": "mc0-sexp", "msgq": "mc0-msgq", "rstreams": "mc0-rstreams"}


def shown_ratio(ratio: float) -> str:
    """Two decimals, or two significant digits below 0.01: a ratio of 0.0045 is not 0.00."""
    return f"{ratio:.2f}" if ratio >= 0.01 or ratio == 0 else f"{ratio:.2g}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench gateways", description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000, help="messages per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the median is reported")
    parser.add_argument("--event-loop", choices=("auto", "uvloop", "asyncio"),
                        help="the brokers' event loop (default: the broker's own default, auto)")
    args = parser.parse_args(argv)
    choose_event_loop(args.event_loop)
    print(f"python {platform.python_version()}, {args.messages:,} x {BODY_SIZE}-byte messages, "
          f"median of {args.repeat}, interleaved; an mc0 publisher in every case; "
          f"event loop {args.event_loop or 'auto'}")
    header = f"{'scenario':<22}{'mc0 subs':>14}" + "".join(f"{door + ' subs':>16}{door + '/mc0':>14}"
                                                         for door in DOORS)
    print(header)
    print("-" * len(header))
    scenarios = (("1 -> 1", 1, args.messages), ("1 -> 4 fan-out", 4, args.messages // 2))
    for name, subscribers, messages in scenarios:
        results = median_cases(("mc0", *DOORS.values()), "broadcast", subscribers, messages, args.repeat)
        baseline = results["mc0"]
        line = f"{name + ' msg/s':<22}{baseline.rate:>14,.0f}"
        for system in DOORS.values():
            result = results[system]
            lost = result.expected - result.delivered
            line += f"{result.rate:>16,.0f}{shown_ratio(result.rate / baseline.rate):>14}"
            if lost:
                line += f"   lost: {lost}"
        print(line)
    return 0
