"""examples/gpt.py held in its first run: `held_gpt.py --hold-at N GPT_ARGS...` runs the example
unchanged, except that in the job's first run (GPUFLEET_RUN=1) every rank waits at step N's
report until it is ended from outside. A test that kills a node mid-training kills it while the
job provably is mid-training: without the hold, a job a few steps from its end on a quick
machine could finish before the kill landed (seen here next to three CPU burners), and the
test would judge a race instead of the heal. Later runs are not held.

The 600 s deadline only keeps a job of a crashed test from holding for ever."""

import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

from gpufleet import train

GPT = Path(__file__).resolve().parents[3] / "examples" / "gpt.py"

args = sys.argv[1:]
at = args.index("--hold-at")
hold_at = int(args[at + 1])
del args[at:at + 2]
first_run = os.environ.get("GPUFLEET_RUN", "1") == "1"
report = train.report


def held_report(step: int, **values: Any) -> None:
    report(step, **values)
    if first_run and step >= hold_at:
        print(f"held at step {step} (first run)", flush=True)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            time.sleep(0.2)


train.report = held_report  # type: ignore[assignment]
sys.argv = [str(GPT), *args]
sys.path.insert(0, str(GPT.parent))
runpy.run_path(str(GPT), run_name="__main__")
