"""The worker bootstrap: progress, health and error records for any script, with no code change.

Every worker gpufleet starts has `bootstrap/site` first on its PYTHONPATH, so Python's startup
imports our `sitecustomize` (and, through it, any `sitecustomize` the user already had). In a
worker of a gpufleet job (RANK and the report address set) it arms three things, none of which
imports torch itself:

- `importwatch`: runs a callback when the script imports a given module, so hooks are installed
  only in scripts that import torch, and only after torch has loaded.
- `steps`: torch's global optimizer step hook counts optimizer steps and reports them, with step
  time, samples seen by DataLoaders and device memory, like `gpufleet.train.report`. It stands
  down as soon as the script uses the SDK (`prepare` or `report`), whose figures are better.
- `errorfile`: an uncaught exception is written to torchrun's per-rank error file
  (TORCHELASTIC_ERROR_FILE), so the failure reason is the failing rank's exception, not a guess
  from interleaved log tails.

`GPUFLEET_BOOTSTRAP=0` (or `bootstrap: false` in the job spec, `--no-bootstrap` on the CLI)
turns all of it off: the script runs exactly as under bare torchrun.
"""

from __future__ import annotations

from pathlib import Path

SITE_DIR = Path(__file__).parent / "site"
SWITCH = "GPUFLEET_BOOTSTRAP"


def enabled(env: dict[str, str]) -> bool:
    """Whether the bootstrap should arm in a process with this environment: a rank of a
    gpufleet job (torchrun sets RANK; the report address says a supervisor listens)."""
    return env.get(SWITCH, "1") != "0" and "RANK" in env and bool(env.get("GPUFLEET_REPORT_ADDR"))
