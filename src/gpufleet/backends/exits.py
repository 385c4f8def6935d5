"""Exit codes with a meaning between a backend's driver and the supervisor's backend object."""

from __future__ import annotations

NODE_LOST_EXIT = 75  # EX_TEMPFAIL: a node left mid-job; the job may run again on other nodes
