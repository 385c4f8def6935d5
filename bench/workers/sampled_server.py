"""`gpufleet server` with a stack sampler, for bench/server_load.py --profile.

cProfile sees only the thread it runs in, and the server's work happens in the request threads
and the loop's thread; so every 5 ms this takes every thread's stack (`sys._current_frames`)
and counts, per function, the samples it was on a stack (inclusive) and on top (self). A thread
waiting for the GIL counts where it waits: this is where requests spend their wall time, not
CPU time. Written to $GPUFLEET_PROFILE_OUT as text when the server exits.

    python bench/workers/sampled_server.py server --port 0   # the CLI's arguments
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from collections import Counter
from types import FrameType

EVERY_S = 0.005
IDLE = ("wait", "select", "accept", "_worker", "run_forever", "_run_once", "get")


def _where(f: FrameType) -> str:
    code = f.f_code
    path = code.co_filename
    short = path.split("site-packages/")[-1].split("/src/")[-1]
    return f"{short}:{code.co_firstlineno}({code.co_name})"


class Sampler:
    def __init__(self) -> None:
        self.inclusive: Counter[str] = Counter()
        self.top: Counter[str] = Counter()
        self.busy = 0  # thread samples not parked in a wait
        self.ticks = 0
        self.me = 0  # the sampler's own thread, set when it runs
        self.stopping = threading.Event()

    def run(self) -> None:
        self.me = threading.get_ident()
        while not self.stopping.wait(EVERY_S):
            self.ticks += 1
            for ident, frame in sys._current_frames().items():
                if ident == self.me:
                    continue
                if frame.f_code.co_name in IDLE and "threading.py" in frame.f_code.co_filename:
                    continue  # a parked worker thread or the loop's sleep
                if frame.f_code.co_name in ("select", "_run_once") or \
                        "selectors.py" in frame.f_code.co_filename:
                    continue  # the event loop waiting for sockets
                self.busy += 1
                self.top[_where(frame)] += 1
                seen: set[str] = set()
                f: FrameType | None = frame
                while f is not None:
                    w = _where(f)
                    if w not in seen:
                        self.inclusive[w] += 1
                        seen.add(w)
                    f = f.f_back

    def write(self, path: str) -> None:
        self.stopping.set()
        with open(path, "w") as out:
            out.write(f"{self.ticks} ticks of {EVERY_S * 1000:.0f} ms, {self.busy} busy thread "
                      "samples\n\n-- inclusive (on the stack) --\n")
            for where, n in self.inclusive.most_common(80):
                out.write(f"{n:8d} {100 * n / max(1, self.busy):5.1f}%  {where}\n")
            out.write("\n-- self (on top) --\n")
            for where, n in self.top.most_common(50):
                out.write(f"{n:8d} {100 * n / max(1, self.busy):5.1f}%  {where}\n")


def cpu_profiles(out: str) -> None:
    """Instead of sampling (GPUFLEET_PROFILE_MODE=cpu): cProfile in every thread, timed by the
    thread's own CPU clock, so a thread waiting for the GIL or a lock costs nothing; the
    threads' profiles merged and written (pstats text, by own time) at exit. Slow: compare the
    shares, not the totals."""
    import cProfile
    import pstats

    profiles: list[cProfile.Profile] = []

    def start(_frame: object, _event: str, _arg: object) -> None:
        prof = cProfile.Profile(time.thread_time)
        profiles.append(prof)
        prof.enable()  # replaces this hook in the new thread

    def write() -> None:
        for prof in profiles:
            prof.disable()
        with open(out, "w") as f:
            stats = pstats.Stats(*profiles, stream=f)
            stats.sort_stats("tottime").print_stats(60)
            stats.sort_stats("cumulative").print_stats(r"gpufleet", 80)

    threading.setprofile(start)
    atexit.register(write)
    main_prof = cProfile.Profile(time.thread_time)
    profiles.append(main_prof)
    main_prof.enable()


def main() -> None:
    out = os.environ["GPUFLEET_PROFILE_OUT"]
    if os.environ.get("GPUFLEET_PROFILE_MODE") == "cpu":
        cpu_profiles(out)
    else:
        sampler = Sampler()
        threading.Thread(target=sampler.run, name="stack-sampler", daemon=True).start()
        atexit.register(sampler.write, out)
    # uvicorn stops on SIGTERM, then raises it again with the handler it found: exit, so that
    # atexit writes the profile
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(0))
    started = time.time()
    sys.argv = ["gpufleet", *sys.argv[1:]]
    from gpufleet.cli import main as cli_main

    try:
        cli_main()
    finally:
        sys.stderr.write(f"sampled for {time.time() - started:.0f} s into {out}\n")


if __name__ == "__main__":
    main()
