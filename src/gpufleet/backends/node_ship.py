"""A node agent that also takes a workdir: the Ray actor's side of the workdir that travels.

`ShippingAgent` is `node_agent.NodeAgent` with the node's part of issue 29 added, as methods
the driver calls before `start`: `sees` (does this node read the probe file), `place_workdir`
(unpack the tar the driver put in Ray's object store into the node's cache, run setup once),
`set_up_shared` (setup once in a workdir the node sees where it is), `warm` (a spare node's copy,
ray_spares.py) and `remove_workdir` (at the end of the run unless kept). Setup's lines join the
agent's own lines, so the driver's next `drain` carries them to the job's log as
`[worker1]: setup: ...` (a spare's are not drained: its warm line says how it went).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

from gpufleet.backends import node_workdir
from gpufleet.backends.node_agent import NodeAgent
from gpufleet.backends.shipping import read_file_is


class ShippingAgent(NodeAgent):
    """NodeAgent plus the workdir's node side. Methods run one at a time (an actor)."""

    def sees(self, path: str, content: str) -> bool:
        return read_file_is(path, content)

    def has_workdir(self, digest: str) -> bool:
        return node_workdir.has(node_workdir.cache_root(), digest)

    def _say(self, line: str) -> None:
        self.lines.append(f"setup: {line}")

    def place_workdir(self, digest: str, tar: bytes | None, setup: str, user: str,
                      name: str) -> str:
        """The node's copy of the workdir (its path), unpacked from `tar` unless already held,
        set up once. SetupFailed's text is the run's reason."""
        folder = node_workdir.place(node_workdir.cache_root(), digest,
                                    None if tar is None else io.BytesIO(tar), setup, self._say,
                                    node=name, user=user, env=os.environ)
        return str(folder)

    def warm(self, digest: str, tar: bytes | None, setup: str, user: str, name: str) -> str:
        """A spare readied for the job (ray_spares.py): the copy placed as for a node, marked
        with the job (`user`) so the runs' own removals leave it. Whether the setup ran now,
        had run before, or there is none."""
        before = node_workdir.setup_marker(node_workdir.cache_root(), digest, setup).exists()
        self.place_workdir(digest, tar, setup, user, name)
        return "none" if not setup else "done before" if before else "ran"

    def set_up_shared(self, root: str, digest: str, setup: str, name: str) -> None:
        node_workdir.set_up(node_workdir.cache_root(), digest, Path(root), setup, self._say,
                            node=name, env=os.environ)

    def remove_workdir(self, digest: str, user: str) -> bool:
        """`user`'s mark off the copy `digest` (EVERY: off every copy it is on, the job's
        mark once the job is done); whether a copy went."""
        if digest == node_workdir.EVERY:
            return bool(node_workdir.remove_everywhere(node_workdir.cache_root(), user))
        return node_workdir.remove(node_workdir.cache_root(), digest, user)
