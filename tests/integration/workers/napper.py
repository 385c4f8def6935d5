"""A worker that never imports torch: reports a step every 0.2 s until it is ended.

For tests of process handling (the killed-supervisor drill), which would otherwise pay torch's
start-up in every worker. It asks for no parent-death signal (train.setup would), so a worker
whose launcher is gone stays alive until gpufleet ends it.

Usage: napper.py [--fail-at STEP] [--slow-term S]
  --fail-at STEP  exit 1 at that step, in the job's first run only
  --slow-term S   on SIGTERM, go on for S seconds before ending (a checkpoint saved on the way
                  out, as long jobs do): whoever ends the job must outwait or kill it
"""

import os
import signal
import sys
import time
from types import FrameType

from gpufleet import train


def main() -> None:
    fail_at = int(sys.argv[sys.argv.index("--fail-at") + 1]) if "--fail-at" in sys.argv else 0
    first_run = os.environ.get("GPUFLEET_RUN", "1") == "1"
    slow_term = float(sys.argv[sys.argv.index("--slow-term") + 1]) if "--slow-term" in sys.argv \
        else 0.0
    if slow_term:
        def ending(_sig: int, _frame: FrameType | None) -> None:
            print(f"napper: SIGTERM, ending in {slow_term:.0f} s", flush=True)
            time.sleep(slow_term)
            print("napper: ended after SIGTERM", flush=True)
            sys.exit(0)

        signal.signal(signal.SIGTERM, ending)
    print(f"napper rank {os.environ.get('RANK', '0')} pid {os.getpid()} started", flush=True)
    step = 0
    while True:
        time.sleep(0.2)
        step += 1
        train.report(step, loss=1.0 / step)
        if first_run and step == fail_at:
            print(f"napper failing at step {step} as asked", flush=True)
            sys.exit(1)


if __name__ == "__main__":
    main()
