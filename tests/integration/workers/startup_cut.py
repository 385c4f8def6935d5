"""A `gpufleet run` cut short during its start-up: the same calls the CLI makes, then this
process ends itself with SIGKILL at a chosen point, leaving the store as a killed `run` would.

Usage: startup_cut.py POINT JOB SCRIPT, POINT one of
  reserved  the cluster made for the job is recorded, no job record yet
  created   the job record exists too, its supervisor not yet started or recorded
  hold      as `created`, then print "ready" and sleep (alive: for `gpufleet stop JOB`)
"""

import os
import signal
import sys
import time

from gpufleet.lifecycle import provision, submit
from gpufleet.spec import ClusterSpec, JobSpec


def main() -> None:
    point, name, script = sys.argv[1:4]
    store = provision.open_store()
    cspec = ClusterSpec(gpu="cpu", count=2)
    if point == "reserved":
        provision.provision(store, cspec, lambda offer: None, for_job=name)
    else:
        submit.submit(store, JobSpec(script=script, name=name, cluster=cspec), lambda offer: None)
    if point == "hold":
        print("ready", flush=True)
        time.sleep(600)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
