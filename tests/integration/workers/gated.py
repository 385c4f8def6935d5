"""A job that holds its devices until a gate file exists, then sleeps a little and exits with
the code given (0 by default): the queue tests decide when running jobs end, and how. No torch:
the test pays only for torchrun.

The 600 s deadline only keeps a job of a test that crashed from running forever (a test's
clean-up stops its jobs anyway). It was 120 s: on a loaded machine (load 17 on 2 cores) a queue
test took longer than that before opening its gate, so a job ended by itself and a job that
should have waited started; a deadline must lie far beyond any test's run."""

import os
import sys
import time
from pathlib import Path

gate = Path(sys.argv[1])
after = float(sys.argv[2]) if len(sys.argv) > 2 else 0.5
deadline = time.monotonic() + 600
while not gate.exists() and time.monotonic() < deadline:
    time.sleep(0.1)
time.sleep(after)
print(f"gated job done (mark {os.environ.get('QUEUE_TEST_MARK', '-')})", flush=True)
sys.exit(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
