"""`doctor --cluster` on nodes of other machines: does each node reach every other node of the
cluster and the submitter's report address, and over which interface? Pure: what the engine's
node said (`backends.base.Reach`) in, one `Check` per address out, each failure with its fix.

The rendezvous and the workers' reports use these same routes: a node that cannot open a TCP
connection to a peer here is a job that would hang in torch's rendezvous instead.
"""

from __future__ import annotations

from gpufleet.backends.base import Reach
from gpufleet.doctor.model import Check


def reach_checks(node: str, found: list[Reach], names: dict[tuple[str, int], str]) -> list[Check]:
    """One check per address node `node` was asked to reach; `names` says what each one is
    ("node worker1's sshd", "the submitter's report address")."""
    checks = []
    for r in found:
        what = names.get((r.address, r.port), f"{r.address}:{r.port}")
        where = f"{r.address}:{r.port}"
        via = f" over {r.dev}" + (f" from {r.src}" if r.src else "") if r.dev else ""
        if r.ok:
            checks.append(Check("reach", "pass", f"reaches {what} ({where}){via}",
                                data={"address": r.address, "port": r.port, "dev": r.dev}))
            continue
        why = r.error or "no connection"
        fix = (f"no route from {node} to {r.address}: put both on one network (or add a route)"
               if not r.dev else
               f"let {node} reach {where}: check the firewall on {r.address} and on {r.dev}, "
               "and that the address is up")
        checks.append(Check("reach", "fail", f"cannot reach {what} ({where}){via}: {why}", fix,
                            data={"address": r.address, "port": r.port, "dev": r.dev}))
    return checks


def unasked(node: str, why: str) -> Check:
    """The node itself could not be asked (down, its key refused or changed)."""
    return Check("reach", "fail", f"cannot ask {node}: {why}",
                 "see `gpufleet pool list`; the node must answer before a job can use it")
