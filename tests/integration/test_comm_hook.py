"""The communication timing does not take DDP's one comm-hook slot from the script."""

from __future__ import annotations

import json
import subprocess
import sys

from fleet_helpers import WORKERS


def test_a_scripts_own_comm_hook_is_registered_timed_and_correct() -> None:
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node=2", str(WORKERS / "comm_hook.py")],
                       capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("{")))
    assert out["hook_calls"] == 3  # the script's hook ran, once per step (one bucket)
    assert out["comm_seconds"] > 0 and out["comm_bytes"] == (16 * 32 + 32 + 32 + 1) * 4
    assert out["replicas_equal"]
