"""Rank 0 kills rank 1 with SIGKILL (as a kill -9 or the kernel's OOM killer would) and ends
at once with exit code 3: both workers have ended before torch's agent next looks, so one poll
finds the two failures. Usage: killed_peer.py (2 ranks)"""

import os
import signal
import time

import torch.distributed as dist

dist.init_process_group("gloo")
pids: list[object] = [None, None]
dist.all_gather_object(pids, os.getpid())
if dist.get_rank() == 0:
    os.kill(int(str(pids[1])), signal.SIGKILL)
    os._exit(3)
time.sleep(120)  # killed long before
