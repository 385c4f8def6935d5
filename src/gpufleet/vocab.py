"""The words a job and a cluster are described with, each list defined once.

Every list of allowed values (strategies, precisions, pipeline schedules, launch frameworks,
networks) is a `Literal` here, and its tuple is read from that `Literal`, so the type pydantic
checks (`spec.py`, `spec_plan.py`), the rules that resolve a layout (`parallelism.py`), the
CLI's help and the error texts cannot drift apart. A leaf with no imports but `typing`, so the
light commands (`--help`) can name the choices for free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

Strategy = Literal["ddp", "fsdp", "zero1", "zero2", "zero3", "tp", "pp"]
Precision = Literal["fp32", "bf16-mixed", "fp16-mixed"]
Schedule = Literal["gpipe", "1f1b"]
Framework = Literal["torchrun", "accelerate", "deepspeed", "ray", "horovod"]
# How devices talk: the first three inside one node, the last two between nodes.
Network = Literal["pcie", "nvlink", "nvswitch", "infiniband", "ethernet"]
# When a node pulls a job's image (launch/container.py): the runtimes' own three words.
Pull = Literal["never", "missing", "always"]

STRATEGIES: tuple[str, ...] = get_args(Strategy)
PRECISIONS: tuple[str, ...] = get_args(Precision)
SCHEDULES: tuple[str, ...] = get_args(Schedule)
FRAMEWORKS: tuple[str, ...] = get_args(Framework)
NETWORKS: tuple[str, ...] = get_args(Network)
PULLS: tuple[str, ...] = get_args(Pull)

# The strategies that say how the data-parallel dimension shares the model (tp and pp fill the
# other dimensions and leave data parallelism to plain DDP).
DATA_PARALLEL: tuple[str, ...] = ("ddp", "fsdp", "zero1", "zero2", "zero3")
# What Accelerate's generated config carries itself (FSDP2 or DDP; no ZeRO-1, no tp/pp mesh).
ACCELERATE_STRATEGIES: tuple[str, ...] = ("ddp", "fsdp", "zero2", "zero3")
IN_NODE_NETWORKS: tuple[str, ...] = ("pcie", "nvlink", "nvswitch")
INTER_NODE_NETWORKS: tuple[str, ...] = ("infiniband", "ethernet")
NVLINK_NETWORKS: tuple[str, ...] = ("nvlink", "nvswitch")  # GPU-to-GPU links inside a node


def spoken(words: Sequence[str]) -> str:
    """`a, b or c`: a list of choices as a help line reads it."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
