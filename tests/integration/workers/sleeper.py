"""A long-running worker: joins the group, then reports a step every 0.2 s until its step budget ends.

Usage: sleeper.py [STEPS]  (default: effectively forever)
"""

import os
import sys
import time

from gpufleet import train


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    ctx = train.setup()
    print(f"sleeper rank {ctx.rank} pid {os.getpid()} started", flush=True)
    for step in range(1, steps + 1):
        time.sleep(0.2)
        train.report(step, loss=1.0 / step, samples=ctx.world_size, total_steps=steps)
    print(f"sleeper rank {ctx.rank} done", flush=True)
    train.cleanup()


if __name__ == "__main__":
    main()
