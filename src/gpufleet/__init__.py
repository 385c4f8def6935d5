"""gpufleet: carve GPU clusters from a pool of machines and run distributed training on them.

Importing the package is cheap on purpose: torch, NVML and Ray are imported only by the code that
needs them, so `gpufleet list` and `gpufleet prices` start in a fraction of a second.
"""

__version__ = "0.1.0"
