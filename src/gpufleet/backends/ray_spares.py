"""A Ray cluster's spare nodes (`--spares N`) warmed for the job while its run goes on.

The SSH driver warms its spare hosts over SSH (ssh_run.py); on a Ray pool the driver already
reaches every node through an actor, so a spare gets one of its own: a `ShippingAgent` pinned to
the spare that holds none of the node's devices (gpufleet's reservation holds them; Ray's
accounting must leave them to the job's next run there). It places the workdir the run shipped,
from the object store copy when the spare lacks it, and runs the job's setup once, so a spare
that replaces a lost node starts its run at once: the next run finds the copy (`already on`,
not sent) and the setup marker.

The copy is marked with the job's name, not the run's: each run removes its own mark from its
nodes when it ends (ray_run `_untravel`), and a spare's copy must outlive the run that warmed it.
The job's mark goes when the job's last run ends, from the spares (`release`) and from every
node of that run, since a node that was a spare still holds it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from gpufleet.backends import node_workdir

WARM_TIMEOUT_S = 3600.0  # a spare's setup (a `pip install`) may take long; the run goes on
PLACED_TIMEOUT_S = 60.0
RELEASE_TIMEOUT_S = 30.0


def spare_name(spare: dict[str, Any]) -> str:
    return f"spare {spare['node_id']} ({spare['address']})"


class Spares:
    """The run's spare nodes (the plan's `spares`) and their agents. `agent_cls` is the
    `ray.remote` class of the node agents; `say` writes a line to the job's log."""

    def __init__(self, ray: Any, agent_cls: Any, spares: list[dict[str, Any]], job: str,
                 report_addr: str, say: Callable[[str], None]):
        self.ray, self.agent_cls, self.spares = ray, agent_cls, spares
        self.job, self.report_addr, self.say = job, report_addr, say
        self.agents: dict[str, Any] = {}
        self.digest = ""
        self.thread: threading.Thread | None = None

    def warm(self, digest: str, tar: bytes, setup: str) -> None:
        """Start warming every spare in the background (the run does not wait)."""
        if not self.spares:
            return
        self.digest = digest
        self.thread = threading.Thread(target=self._warm_all, args=(tar, setup), daemon=True,
                                       name="warm-spares")
        self.thread.start()

    def _warm_all(self, tar: bytes, setup: str) -> None:
        ref: list[Any] = []  # the tar in the object store, put once for the spares that lack it

        def tar_ref() -> Any:
            if not ref:
                ref.append(self.ray.put(tar))
            return ref[0]

        for spare in self.spares:
            self.say(self._warm_one(spare, tar_ref, setup))

    def _warm_one(self, spare: dict[str, Any], tar_ref: Callable[[], Any], setup: str) -> str:
        """One spare made ready; the line that says how it went."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        t0 = time.monotonic()
        ray, where = self.ray, spare_name(spare)
        try:
            agent = self.agent_cls.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=spare["ray_id"],
                                                                   soft=False),
                num_cpus=0, max_restarts=0, max_concurrency=1,
            ).remote(f"spare {spare['node_id']}", self.report_addr)
            self.agents[spare["node_id"]] = agent
            ray.get(agent.ready.remote(), timeout=PLACED_TIMEOUT_S)
            has = bool(ray.get(agent.has_workdir.remote(self.digest), timeout=PLACED_TIMEOUT_S))
            done = ray.get(agent.warm.remote(self.digest, None if has else tar_ref(), setup,
                                             self.job, f"spare {spare['node_id']}"),
                           timeout=WARM_TIMEOUT_S)
        except Exception as exc:  # placed nowhere, a failed setup: the spare stays cold
            cause = getattr(exc, "cause", None) or exc
            text = " ".join(str(cause).split())[:300] or type(cause).__name__
            return f"{where} not warmed: {type(cause).__name__}: {text}"
        sent = "0 bytes shipped (it had the copy)" if has else "shipped"
        return (f"{where} warm in {time.monotonic() - t0:.1f} s: workdir {self.digest[:12]} "
                f"{sent}, setup {done}")

    def release(self) -> None:
        """The job is done with the workdir: its mark off every spare (the run's nodes drop
        theirs in ray_run `_untravel`)."""
        if self.thread is not None:
            self.thread.join(timeout=RELEASE_TIMEOUT_S)
        if not self.digest:
            return
        refs = []
        for agent in self.agents.values():
            with contextlib.suppress(Exception):
                refs.append(agent.remove_workdir.remote(node_workdir.EVERY, self.job))
        with contextlib.suppress(Exception):
            self.ray.wait(refs, num_returns=len(refs), timeout=RELEASE_TIMEOUT_S)

    def close(self) -> None:
        for agent in self.agents.values():
            with contextlib.suppress(Exception):
                self.ray.kill(agent)
        self.agents.clear()
