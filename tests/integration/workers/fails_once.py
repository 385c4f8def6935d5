"""A worker that never imports torch: reports 5 steps and exits 0, except that in the job's
first run the last rank exits 1 at step 3 (a script failure that loses no node).

For tests of what a restart keeps (a Slurm job's allocation), without torch in each worker.
"""

import os
import sys
import time

from gpufleet import train


def main() -> None:
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    first_run = os.environ.get("GPUFLEET_RUN", "1") == "1"
    for step in range(1, 6):
        time.sleep(0.3)
        train.report(step, loss=1.0 / step)
        if first_run and step == 3 and rank == world - 1:
            print(f"fails_once rank {rank} failing at step {step} as asked", flush=True)
            sys.exit(1)
    print(f"fails_once rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
