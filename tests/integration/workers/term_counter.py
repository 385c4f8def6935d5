"""Counts the SIGTERMs it gets: a line per signal in OUT; exits 0.5 s after the first one.

Usage: term_counter.py OUT
"""

import signal
import sys
import time

OUT = sys.argv[1]
first: list[float] = []


def on_term(_sig: int, _frame: object) -> None:
    with open(OUT, "a") as f:
        f.write("SIGTERM\n")
    if not first:
        first.append(time.monotonic())


signal.signal(signal.SIGTERM, on_term)
with open(OUT, "a") as f:
    f.write("started\n")
while not first or time.monotonic() - first[0] < 0.5:
    time.sleep(0.02)
with open(OUT, "a") as f:
    f.write("exit\n")
