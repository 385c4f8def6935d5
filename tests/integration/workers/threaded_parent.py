"""A multi-threaded parent, as a supervisor is: starts `term_counter.py OUT` through
`LocalBackend.start` from its main thread, with 8 other threads alive, then waits to be killed.

Usage: threaded_parent.py OUT
"""

import os
import sys
import threading
import time
from pathlib import Path

from gpufleet.backends.base import Prepared
from gpufleet.backends.local import LocalBackend


def main() -> None:
    out = sys.argv[1]
    for _ in range(8):
        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
    counter = Path(__file__).with_name("term_counter.py")
    LocalBackend(cpu_slots=1).start(Prepared([sys.executable, str(counter), out], {}),
                                    dict(os.environ), Path.cwd())
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
