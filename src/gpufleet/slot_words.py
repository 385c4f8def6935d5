"""How CPU slots are put to a user: a slot is one worker process on this host's cores, not a GPU,
and slots exchange tensors through the host's shared memory (gloo), not over a PCIe link.

Inside, a CPU-slot cluster keeps the fabric `pcie` (what `pool.model.Node.fabric_for` gives it,
and what the planner, the allocator and the price books read); only what is shown to a user
says otherwise. A leaf (it imports only `vocab`, another), so `list` (through `snapshot`) can use it for free.
"""

from __future__ import annotations

from gpufleet.vocab import IN_NODE_NETWORKS

CPU = "cpu"  # the catalog's type name for CPU slots
SHARED_MEMORY = "shared memory"
MAX_SLOTS = 128  # what --cpu-slots and $GPUFLEET_CPU_SLOTS may ask for (backends.local)


def is_slots(gpu: str) -> bool:
    return gpu == CPU


def network_shown(gpu: str, network: str) -> str:
    """The network as a user should read it: CPU slots in one host talk through its memory.
    Across nodes (a Ray pool of CPU nodes) the network between them is what it is."""
    return SHARED_MEMORY if is_slots(gpu) and network in IN_NODE_NETWORKS else network


def devices_shown(gpu: str, count: int) -> str:
    """`2 CPU slots`, `1 CPU slot`, or `8 x H100-SXM`."""
    if is_slots(gpu):
        return f"{count} CPU slot{'' if count == 1 else 's'}"
    return f"{count} x {gpu}"


def unit(gpu: str) -> str:
    """What one device is billed as: `$/slot-hour` for CPU slots, else `$/GPU-hour`."""
    return "slot" if is_slots(gpu) else "GPU"


def beyond_host(count: int, offered: int) -> str:
    """Why `count` CPU slots cannot be had on this host, which offers `offered`."""
    return (f"{count} CPU slots asked for, but this host offers {offered}; offer more with "
            f"--cpu-slots {count} (or $GPUFLEET_CPU_SLOTS), at most {MAX_SLOTS}, or ask for "
            f"{offered} or fewer")
