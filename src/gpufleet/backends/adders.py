"""`pool add KIND`, each kind's part: the options it takes, reaching the engine, and what the
pool records. `lifecycle.pool_setup` names the pool and stores it; this module never touches
the store, so a new engine's `pool add` is a function here and its row in `registry.ENGINES`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpufleet.backends.ssh_conn import Host
from gpufleet.errors import ConflictError, SpecError
from gpufleet.pool.model import Node

_ADDRESS = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")


def check_address(address: str) -> str:
    """A Ray head's HOST:PORT, refused before anything is reached."""
    if not _ADDRESS.match(address) or not 0 < int(address.rsplit(":", 1)[1]) < 65536:
        raise SpecError([("address", f"'{address}' is not HOST:PORT of a Ray head, e.g. "
                          "10.0.0.5:6379")])
    return address


@dataclass(frozen=True)
class HostsAsk:
    """`pool add ssh`'s own options: the hosts (`--host`, repeatable, or `--hostfile`) and the
    defaults every host gets unless its hostfile line says otherwise."""

    hosts: list[str] = field(default_factory=list)
    hostfile: Path | None = None
    user: str | None = None
    identity: Path | None = None  # a private key's path; the key is never read or copied
    port: int | None = None
    python: str | None = None

    def given(self) -> list[str]:
        """The options given, as their flags name them."""
        return [name for name, v in (("host", self.hosts or None), ("hostfile", self.hostfile),
                                     ("user", self.user), ("identity", self.identity),
                                     ("port", self.port), ("python", self.python))
                if v is not None]


@dataclass(frozen=True)
class AddRequest:
    """What `pool add` was given, the pool's name already checked. `claim` refuses a name
    already taken; an adder calls it after its own checks and before reaching the engine."""

    name: str
    address: str | None
    shapes: list[str]
    token_file: Path | None
    partition: str | None
    account: str | None
    home: Path  # GPUFLEET_HOME: where a pool keeps its files (a Ray token's copy)
    claim: Callable[[], None]
    ssh: HostsAsk = field(default_factory=HostsAsk)


@dataclass(frozen=True)
class Registration:
    """What a pool of the kind records, what it holds, and how to undo what the adder left
    (a token's copy) if the pool cannot be stored."""

    address: str | None
    settings: dict[str, Any]
    summary: str  # what `pool add` says of it, e.g. "simulated, 1000 nodes, 8000 devices"
    nodes: int  # live nodes
    devices: int
    undo: Callable[[], None] = field(default=lambda: None)


def _no_hosts(r: AddRequest, kind: str) -> None:
    given = r.ssh.given()
    if given:
        raise SpecError([(given[0], f"--{given[0]} is for an ssh pool, not a {kind} pool")])


def _slurm_only(r: AddRequest, kind: str) -> None:
    _no_hosts(r, kind)
    given = [f for f, v in (("partition", r.partition), ("account", r.account)) if v is not None]
    if given:
        raise SpecError([(given[0], f"--{given[0]} is for a Slurm pool, not a {kind} pool")])


def add_ray(r: AddRequest) -> Registration:
    """An existing Ray cluster, once it is reachable with its token; the token is copied
    beside the pool (and forgotten again by `undo`)."""
    from gpufleet.backends import ray_auth
    from gpufleet.backends.ray import RayBackend

    _slurm_only(r, "ray")
    if r.address is None or r.shapes:
        raise SpecError([("address", "a Ray pool needs --address HOST:PORT (and no --shape)")])
    check_address(r.address)
    r.claim()
    given = ray_auth.given_token(r.token_file, os.environ, Path.home())
    path = None if given is None else ray_auth.save_token(
        ray_auth.pool_token_path(r.home, r.name), given.token)
    try:  # reachable, the token accepted, and what it has
        found: list[Node] = RayBackend(r.name, r.address, path,
                                       token_source=given.source if given else None,
                                       adding=True).discover()
    except BaseException:
        if path is not None:
            ray_auth.forget(path)
        raise
    live = [n for n in found if n.healthy]
    devices = sum(len(n.devices) for n in live)
    return Registration(r.address, {"token_file": str(path)} if path else {},
                        f"Ray cluster at {r.address}, {len(live)} live node(s), {devices} "
                        "device(s)", len(live), devices,
                        undo=(lambda: ray_auth.forget(path)) if path else (lambda: None))


def add_sim(r: AddRequest) -> Registration:
    """A synthetic pool of declared devices (`--shape NODESxGPU:PER_NODE`)."""
    from gpufleet.backends import sim

    _slurm_only(r, "sim")
    if r.address is not None or r.token_file is not None:
        name = "address" if r.address is not None else "token_file"
        raise SpecError([(name, f"a sim pool has no {name.replace('_', ' ')}; give --shape")])
    parsed = sim.parse_shapes(r.shapes)
    r.claim()
    nodes, devices = sum(x.nodes for x in parsed), sum(x.nodes * x.per_node for x in parsed)
    return Registration(None, {"shapes": [x.text() for x in parsed]},
                        f"simulated, {nodes} nodes, {devices} devices", nodes, devices)


def add_slurm(r: AddRequest) -> Registration:
    """A Slurm partition reachable with this machine's Slurm client commands (and its
    $SLURM_CONF, kept with the pool); no --partition: the cluster's default partition."""
    from gpufleet.backends.slurm import SlurmBackend

    wrong = [f for f, v in (("address", r.address), ("token_file", r.token_file),
                            ("shape", r.shapes or None)) if v is not None] + r.ssh.given()
    if wrong:
        raise SpecError([(wrong[0], "a Slurm pool takes --partition and --account only")])
    r.claim()
    conf = os.environ.get("SLURM_CONF") or None
    probe = SlurmBackend(r.name, None, r.account, conf)
    known = probe.partitions()
    partition = r.partition
    if partition is None:
        partition = probe.default_partition()
        if partition is None:
            raise SpecError([("partition", "the Slurm cluster has no default partition; give "
                              f"--partition, one of: {', '.join(known) or 'none'}")])
    elif partition not in known:
        raise SpecError([("partition", f"'{partition}' is not a partition of this Slurm "
                          f"cluster; allowed: {', '.join(known) or 'none'}")])
    found = SlurmBackend(r.name, partition, r.account, conf).discover()
    settings = {"partition": partition, "account": r.account, "slurm_conf": conf}
    live = [n for n in found if n.healthy]
    devices = sum(len(n.devices) for n in found)
    types = ", ".join(sorted({d.gpu for n in found for d in n.devices})) or "no GPUs"
    return Registration(None, {k: v for k, v in settings.items() if v},
                        f"Slurm partition {partition}, {len(found)} node(s) ({len(live)} up), "
                        f"{devices} GPU(s): {types}", len(live), devices)


def ssh_hosts(ask: HostsAsk, hostfile_text: str | None) -> list[Host]:
    """The pool's hosts from `--host`s or a hostfile's text, each with the defaults given;
    every problem a SpecError naming its field (a hostfile's names its line)."""
    from gpufleet import catalog
    from gpufleet.backends import ssh_conn

    if bool(ask.hosts) == (ask.hostfile is not None):
        raise SpecError([("host", "give the machines as --host ADDR (repeatable) or "
                          "--hostfile FILE (lines: HOST slots=N), one of the two")])
    if ask.port is not None and not 0 < ask.port < 65536:
        raise SpecError([("port", f"{ask.port} is not allowed; allowed: 1-65535")])
    defaults = ssh_conn.Host(address="-", port=ask.port or 22, user=ask.user,
                             identity=str(ask.identity) if ask.identity else None,
                             python=ask.python or "python3")
    try:
        if hostfile_text is not None:
            hosts = ssh_conn.parse_hostfile(hostfile_text, defaults)
        else:
            hosts = [replace(defaults, address=ssh_conn.check_host(h)) for h in ask.hosts]
    except ValueError as exc:
        raise SpecError([("hostfile" if hostfile_text is not None else "host", str(exc))]) from None
    if ask.user is not None:
        try:
            ssh_conn.check_user(ask.user)
        except ValueError as exc:
            raise SpecError([("user", str(exc))]) from None
    for h in hosts:  # a declared GPU type must be the catalog's, before any host is reached
        if h.gpu:
            try:
                catalog.resolve_gpu(h.gpu, "gpu")
            except SpecError as exc:
                raise SpecError([("hostfile", f"gpu={h.gpu} of {h.address}: "
                                  f"{exc.problems[0][1]}")]) from None
    if len({(h.address, h.port) for h in hosts}) < len(hosts):
        raise SpecError([("host", "a host is given twice")])
    for h in hosts:
        if h.identity and not Path(h.identity).is_file():
            raise SpecError([("identity", f"{h.identity} (for {h.address}) does not exist; "
                              "give the path of a private key whose .pub is in the host's "
                              "authorized_keys")])
    return hosts


def add_ssh(r: AddRequest) -> Registration:
    """A team's own machines over ssh: each host's key scanned and pinned (shown), then every
    host probed with those keys. A host that does not answer or refuses the key refuses the
    pool, and nothing is kept; one without torch, or with another gpufleet, is kept and shown
    not healthy (`pool list` says why)."""
    from gpufleet.backends import ssh_keys
    from gpufleet.backends.ssh import SshBackend

    if r.address is not None or r.shapes or r.token_file is not None or r.partition \
            or r.account:
        wrong = next(f for f, v in (("address", r.address), ("shape", r.shapes),
                                    ("token_file", r.token_file), ("partition", r.partition),
                                    ("account", r.account)) if v)
        raise SpecError([(wrong, "an ssh pool takes --host/--hostfile, --user, --identity, "
                          "--port and --python only")])
    text = None
    if r.ssh.hostfile is not None:
        try:
            text = r.ssh.hostfile.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError([("hostfile", f"cannot read {r.ssh.hostfile}: "
                              f"{getattr(exc, 'strerror', None) or exc}")]) from None
    hosts = ssh_hosts(r.ssh, text)
    r.claim()
    path = ssh_keys.pool_known_hosts(r.home, r.name)
    try:
        shown = ssh_keys.write(path, ssh_keys.scan(hosts))
        backend = SshBackend(r.name, hosts, path)
        found = backend.discover()
        for host in hosts:  # ssh itself failed: a host that cannot be asked is not added
            why = backend.failed.get(host.address)
            if why is not None:
                raise ConflictError(why.split(": ", 1)[1] if why.startswith(
                    ("key refused", "host key")) else f"host {host.address}: {why}")
    except BaseException:
        ssh_keys.forget(path)
        raise
    live = [n for n in found if n.healthy]
    devices = sum(len(n.devices) for n in live)
    bad = [f"{n.id}: {n.state}" for n in found if not n.healthy]
    summary = (f"{len(hosts)} host(s) over ssh; host keys pinned (check them against the "
               "machines' own):\n  " + "\n  ".join(shown)
               + "".join(f"\n  not ready: {b}" for b in bad)
               + f"\n{len(live)} ready, {devices} device(s)")
    return Registration(None, {"hosts": [h.to_json() for h in hosts],
                               "known_hosts": str(path)}, summary, len(live), devices,
                        undo=lambda: ssh_keys.forget(path))
