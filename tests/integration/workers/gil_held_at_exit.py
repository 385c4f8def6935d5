"""A DDP script (gloo) whose last collective is still the gloo thread's to free when the script
ends, and whose group is freed with its model: the race a warm rank lost on a loaded machine
(launch/warm_rank.py `_guarded`), made certain. torch keeps a Python object in the state of
every collective started during a backward (here stashed by hand, as torch does); the thread
that frees such a collective needs the GIL, which this script never offers while it runs (a
switch interval of 1,000 s) and which the interpreter holds while it frees a DDP model whose
reducer owns the last reference to the group (its destructor waits for that thread).
It also leaves a file open with a line in its buffer (PATH.RANK), as a sloppy script does: a
fresh interpreter writes it out as it ends, and so must a warm rank.
With `in-main`, the model is a local of `main()`, which leaves the group and returns, as the
PyTorch DDP tutorial's scripts do: the model is freed there, while the script still runs.
Usage: gil_held_at_exit.py PATH [in-main] (2 ranks or more)"""

import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    model = DDP(torch.nn.Linear(8, 1))  # its reducer holds the group after destroy_process_group
    model(torch.randn(4, 8)).sum().backward()
    sys.setswitchinterval(1000.0)  # no thread is handed the GIL until this one blocks
    torch._C._stash_obj_in_tls("gil_held_at_exit", object())  # what every backward stashes
    dist.all_reduce(torch.ones(1 << 24), async_op=True)  # 64 MB: still running when dropped
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        pass
    dist.destroy_process_group()
    if "in-main" not in sys.argv[2:]:
        KEEP.append(model)  # freed with the script's globals, at its end


KEEP: list[object] = []
dist.init_process_group("gloo")
left_open = open(f"{sys.argv[1]}.{dist.get_rank()}", "w")  # noqa: SIM115 - never closed
left_open.write("still buffered at the end\n")
main()
sys.exit(0)
