"""An ordinary DDP script that says how it was started, before it imports torch: whether torch
was already loaded in its process (a warm start forks from a process that has it), its
parent's command, `__name__`, argv, sys.path[0] and how many objects its garbage collector
never walks (gc.freeze). Then a few DDP steps with a DataLoader whose
worker is *spawned* (a fresh interpreter that must import this script's Dataset class by the
script's path), and the final loss, which a warm and a plain start must print alike.
Usage: warm_probe.py [--fail-first-run] [STEPS [HOLD]]: with HOLD, every rank waits after its
steps until the file HOLD exists (a test releases it once it saw what it waits for, never after
a guessed time); with --fail-first-run the last rank exits 1 after its first line in the job's
first run, so the run after it shows how a restarted rank was started."""

import gc
import os
import sys
import time

WARM = "torch" in sys.modules  # before this script imports anything heavy
FROZEN = gc.get_freeze_count()  # what the collector never walks in this process
FAIL_FIRST_RUN = "--fail-first-run" in sys.argv
if FAIL_FIRST_RUN:
    sys.argv.remove("--fail-first-run")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402


class Squares(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Defined here, so a spawned DataLoader worker must find this script to unpickle it."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(256, 8, generator=g)
        self.y = (self.x ** 2).sum(1, keepdim=True)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:  # no psutil in a bare image
        parent = f.read().replace(b"\0", b" ").decode()
    print(f"probe rank {rank} warm={WARM} name={__name__} argv={sys.argv} "
          f"path0={sys.path[0]} forkserver_parent={'multiprocessing.forkserver' in parent} "
          f"frozen={FROZEN} run={os.environ.get('GPUFLEET_RUN')}",
          flush=True)
    if FAIL_FIRST_RUN and os.environ.get("GPUFLEET_RUN") == "1" \
            and rank == dist.get_world_size() - 1:
        print(f"probe rank {rank} failing in the first run as asked", flush=True)
        sys.exit(1)
    torch.manual_seed(0)
    data = Squares()
    loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data, shuffle=False),
                        num_workers=1, multiprocessing_context="spawn")
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    done = 0
    while done < steps:
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
            if done >= steps:
                break
    while len(sys.argv) > 2 and not os.path.exists(sys.argv[2]):
        time.sleep(0.05)
    if rank == 0:
        print(f"probe final loss {loss.item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
