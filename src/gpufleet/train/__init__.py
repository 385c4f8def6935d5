"""The in-worker SDK: `setup()` to join the job's process group, `report()` to show progress.

Scripts using it stay ordinary torchrun scripts: under bare `torchrun` (or plain `python`) the
calls work the same and reports simply go nowhere. Importing this module does not import torch;
`setup()` does.
"""

from gpufleet.train.context import Context, cleanup, setup
from gpufleet.train.report import report

__all__ = ["Context", "cleanup", "report", "setup"]
