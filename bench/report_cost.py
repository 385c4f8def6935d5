"""What one `gpufleet.train.report()` call costs the training loop, against a loop without it.

Binds a UDP socket like the supervisor's (nobody reads it, the worst case: the kernel buffer fills
and datagrams are dropped), points GPUFLEET_REPORT_ADDR at it with a report key set (so each call
signs its datagram, as under a supervisor), and times N calls with the arguments examples/gpt.py
passes. Prints microseconds per call (median of --reps runs).

    .venv/bin/python bench/report_cost.py [--calls 100000] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    os.environ["GPUFLEET_REPORT_ADDR"] = f"127.0.0.1:{sink.getsockname()[1]}"
    from gpufleet.reportauth import KEY_ENV, new_key

    os.environ[KEY_ENV] = new_key()  # without one, report() sends nothing
    from gpufleet import train

    per_call = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        for step in range(1, args.calls + 1):
            train.report(step, loss=2.5, samples=160, total_steps=args.calls,
                         step_time_seconds=0.08, data_time_seconds=0.001, lr=3e-3)
        per_call.append((time.perf_counter() - t0) / args.calls * 1e6)
    print(f"report(): {statistics.median(per_call):.1f} us per call "
          f"(median of {args.reps} x {args.calls} calls; runs: "
          f"{', '.join(f'{x:.1f}' for x in per_call)})")


if __name__ == "__main__":
    main()
