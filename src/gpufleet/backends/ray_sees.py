"""Whether a Ray pool's nodes read this machine's files: the Ray side of `shipping.SharesFiles`.

`python -m gpufleet.backends.ray_sees ADDRESS PATH CONTENT RAY_ID...` connects to the cluster
and runs one tiny task pinned to each node (node affinity, not soft; no CPU held, so a node busy
with a job still answers) that reads PATH and compares it with CONTENT; it prints one JSON line,
{ray_id: true|false}. It runs in a child process, as `ray_probe` does, so the supervisor and the
CLI never import Ray or register a Ray job of their own; CONTENT is a random probe, not a secret.
"""

from __future__ import annotations

import json
import os
import sys

from gpufleet.backends.ray_auth import env_token_path

TASK_TIMEOUT_S = 30.0  # how long the tasks may take once Ray is connected


def _ask(address: str, path: str, content: str, ray_ids: list[str]) -> dict[str, bool]:
    from gpufleet.backends.ray import connect
    from gpufleet.backends.shipping import read_file_is

    ray = connect(address, env_token_path(os.environ))
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(read_file_is)
    refs = {rid: task.options(num_cpus=0, max_retries=0, scheduling_strategy=(
        NodeAffinitySchedulingStrategy(node_id=rid, soft=False))).remote(path, content)
        for rid in ray_ids}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=TASK_TIMEOUT_S)
    found: dict[str, bool] = {}
    for rid, ref in refs.items():
        if ref in ready:
            try:
                found[rid] = bool(ray.get(ref, timeout=5))
            except Exception:  # the node died under the task: it does not see the file
                found[rid] = False
    return found


def main(argv: list[str]) -> int:
    address, path, content, *ray_ids = argv
    print(json.dumps(_ask(address, path, content, ray_ids)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
