"""Pools on a real multi-node Ray cluster on this machine: three raylets on their own loopback
addresses, each declaring 2 simulated H100s (CPU workers with gloo).

The cluster is the one `.ci/run` (or `scripts/check`) starts with `gpufleet pool up --local`,
named by $GPUFLEET_TEST_RAY_HOME / $GPUFLEET_TEST_RAY_POOL; run alone, this module starts its
own and stops it at the end. Each test adds it to its own fleet as pool `ray` and checks that no
process of its jobs is left on the Ray nodes.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from fleet_helpers import CLI, EXAMPLES, WORKERS, Fleet, error_lines
from sqlalchemy import text as sql_text

from gpufleet.backends import ray_local
from gpufleet.lifecycle import pools
from gpufleet.store import Store

NODES = 3
PER_NODE = 2


@dataclass
class RayPool:
    name: str
    address: str
    cfg: ray_local.LocalRay
    home: Path


def _pool_of(home: Path, name: str) -> RayPool:
    store = Store(url=f"sqlite:///{home / 'state.db'}")
    row = pools.get(store, name)
    store.close()
    assert row.address is not None
    return RayPool(name, row.address, ray_local.LocalRay.from_json(row.spec_json), home)


@pytest.fixture(scope="module")
def ray_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayPool]:
    home_env, name_env = os.environ.get("GPUFLEET_TEST_RAY_HOME"), os.environ.get(
        "GPUFLEET_TEST_RAY_POOL")
    if home_env and name_env:
        yield _pool_of(Path(home_env), name_env)
        return
    home = tmp_path_factory.mktemp("raypool") / "home"
    name = f"test-{os.getpid() % 100000}"
    env = {**os.environ, "GPUFLEET_HOME": str(home)}
    up = subprocess.run([*CLI, "pool", "up", "--local", "--nodes", str(NODES), "--name", name,
                         "--gpus-per-node", str(PER_NODE)], env=env, capture_output=True,
                        text=True, timeout=240)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield _pool_of(home, name)
    finally:
        cfg = _pool_of(home, name).cfg
        subprocess.run([*CLI, "pool", "down", name], env=env, capture_output=True, timeout=120)
        assert not ray_local.processes(cfg), "the test pool's Ray processes outlived pool down"


@pytest.fixture
def rfleet(fleet: Fleet, ray_pool: RayPool) -> Iterator[Fleet]:
    """A fleet whose default pool is the Ray cluster; afterwards no job process may be left on
    the Ray nodes (they do not carry the fleet's GPUFLEET_HOME, but do carry GPUFLEET_JOB)."""
    fleet.ok("pool", "add", "ray", "--address", ray_pool.address, "--token-file",
             ray_pool.cfg.token_file, timeout=90)
    yield fleet
    jobs = [j.name for j in (fleet.home / "jobs").iterdir()] if (fleet.home / "jobs").exists() \
        else []
    fleet.cleanup()
    deadline = time.monotonic() + 20
    while (left := _job_processes(jobs)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for p in left:
        p.kill()
    assert not left, f"job processes left on the Ray nodes: {[p.pid for p in left]}"


def _job_processes(jobs: list[str]) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("GPUFLEET_JOB") in jobs and p.pid != os.getpid():
                found.append(p)
        except psutil.Error:
            continue
    return found


def _nodes(fleet: Fleet) -> list[dict[str, Any]]:
    listing = fleet.json("pool", "list", "ray", "--json")
    assert len(listing) == 1 and "nodes" in listing[0], listing
    return listing[0]["nodes"]


def _wait_healthy(fleet: Fleet, count: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(1 for n in _nodes(fleet) if n["health"] == "ok") >= count:
            return
        time.sleep(1.0)
    pytest.fail(f"the Ray pool did not get back to {count} healthy nodes: {_nodes(fleet)}")


def _wait_free(fleet: Fleet, names: set[str] | None = None,
               timeout: float = 90.0) -> list[dict[str, Any]]:
    """The nodes (all, or `names`) once every healthy one among them shows all its devices
    free. A stop frees the store's holds at once, but Ray hands a placement group's resources
    back in its own time (seconds on a loaded machine), so one look could count them still
    held; a node Ray reports not alive shows nothing free, which is Ray's word, not a hold."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = [n for n in _nodes(fleet) if names is None or n["node"] in names]
        if all(n["free"] == PER_NODE for n in nodes if n["health"] == "ok"):
            return nodes
        if time.monotonic() > deadline:
            pytest.fail(f"the nodes' devices were not freed in {timeout:.0f} s: {nodes}")
        time.sleep(1.0)


def _events(fleet: Fleet, job: str) -> list[dict[str, Any]]:
    return fleet.json("status", job, "--json").get("events", [])


# ------------------------------------------------------------------------------ the pool itself


def test_pool_list_shows_every_node_from_ray_resources_and_labels(rfleet: Fleet,
                                                                    ray_pool: RayPool) -> None:
    nodes = _nodes(rfleet)
    assert [n["node"] for n in nodes] == ["head"] + [f"worker{i}" for i in range(1, NODES)]
    for i, n in enumerate(nodes):
        assert n["address"] == ray_pool.cfg.node_ip(i)
        assert (n["gpu"], n["count"], n["free"]) == ("H100-SXM", PER_NODE, PER_NODE)
        assert (n["fabric"], n["network"], n["health"]) == ("nvswitch", "infiniband", "ok")
        assert n["simulated"] is True and n["memory_gb"] == 80
    table = rfleet.ok("pool", "list").stdout
    assert "Pool ray (default): ray" in table and "H100-SXM (simulated)" in table
    assert "never billed" in table


def test_pool_add_refuses_bad_input_with_one_line(fleet: Fleet) -> None:
    for args, field in ((["pool", "add", "ray", "--address", "nohost"], "address"),
                        (["pool", "add", "ray"], "address"),
                        (["pool", "add", "kubernetes"], "kind"),
                        (["pool", "up", "--local", "--nodes", "0"], "nodes"),
                        (["pool", "up", "--nodes", "2"], "local"),
                        (["pool", "use", "nope"], "pool"),
                        (["pool", "add", "ray", "--address", "127.0.0.1:1"], "pool")):
        r = fleet(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        lines = error_lines(r.stderr)
        assert len(lines) == 1 and f"{field}:" in lines[0], (args, r.stderr)
        assert "Traceback" not in r.stderr
    assert "cannot reach the Ray cluster at 127.0.0.1:1" in fleet("pool", "add", "ray",
                                                                  "--address", "127.0.0.1:1").stderr
    assert fleet.json("pool", "list", "--json")[0]["pool"] == "local"  # nothing half-added


# ------------------------------------------------------------------------------ token auth


def test_the_pool_keeps_its_own_private_token(ray_pool: RayPool) -> None:
    token = Path(ray_pool.cfg.token_file)
    assert token == ray_pool.home / "pools" / ray_pool.name / "ray-auth-token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and len(token.read_text()) == 64
    for p in ray_pool_raylets(ray_pool):  # every raylet was given exactly that file
        env = p.environ()
        assert (env.get("RAY_AUTH_MODE"), env.get("RAY_AUTH_TOKEN_PATH")) == ("token", str(token))
        assert "RAY_AUTH_TOKEN" not in env


def ray_pool_raylets(ray_pool: RayPool) -> list[psutil.Process]:
    found = [p for p in ray_local.processes(ray_pool.cfg) if p.name() == "raylet"]
    assert len(found) == NODES, found
    return found


def test_pool_add_without_or_with_a_wrong_token_says_how_to_fix_it_at_once(
        fleet: Fleet, ray_pool: RayPool, tmp_path: Path) -> None:
    """Each refusal is one line, and leaves no pool and no copy of the token behind. It comes
    before Ray's own client starts its 20 s of retries: those print a warning a second, so the
    one line on stderr is the proof, whatever the machine's load (no clock is judged)."""
    empty_home = tmp_path / "empty-home"
    empty_home.mkdir()
    wrong = tmp_path / "wrong-token"
    wrong.write_text("0" * 64)
    cases = [([], {}, "uses token authentication and no token was given: pass --token-file"),
             (["--token-file", str(wrong)], {}, f"refused the token from {wrong}"),
             ([], {"RAY_AUTH_TOKEN": "f" * 64}, "refused the token from $RAY_AUTH_TOKEN"),
             ([], {"RAY_AUTH_TOKEN_PATH": str(wrong)}, f"refused the token from {wrong}")]
    for args, extra, want in cases:
        r = fleet("pool", "add", "ray", "--address", ray_pool.address, *args,
                  env={"HOME": str(empty_home), **extra})
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and want in lines[0], (args, r.stderr)
    assert [p["pool"] for p in fleet.json("pool", "list", "--json")] == ["local"]
    assert not (fleet.home / "pools").exists() or not any((fleet.home / "pools").iterdir())
    assert not any(empty_home.iterdir()), "pool add wrote into HOME"


def test_pool_add_with_the_token_from_the_environment_keeps_a_copy_until_removed(
        fleet: Fleet, ray_pool: RayPool) -> None:
    token = Path(ray_pool.cfg.token_file).read_text()
    r = fleet("pool", "add", "ray", "--address", ray_pool.address, "--name", "viaenv",
              "--no-default", env={"RAY_AUTH_TOKEN": token})
    assert r.returncode == 0, r.stderr
    copy = fleet.home / "pools" / "viaenv" / "ray-auth-token"
    assert copy.read_text() == token and stat.S_IMODE(copy.stat().st_mode) == 0o600
    listing = fleet.json("pool", "list", "viaenv", "--json")  # no token in this environment
    assert len(listing[0]["nodes"]) == NODES, listing
    copy.write_text("0" * 64)  # as if the cluster had been restarted with a new token
    [broken] = fleet.json("pool", "list", "viaenv", "--json")
    assert "refused the token from pool viaenv's copy" in broken["error"], broken
    assert f"gpufleet pool add ray --address {ray_pool.address} --name viaenv" in broken["error"]
    fleet.ok("pool", "remove", "viaenv")
    assert not copy.exists()


# ------------------------------------------------------------------------------ allocation


def test_launch_gang_allocates_whole_nodes_and_refuses_with_the_reason(rfleet: Fleet) -> None:
    big = rfleet.json("launch", "--gpu", "H100", "--count", "4", "--nodes", "2", "--network",
                      "infiniband", "--name", "big", "-y", "--json")
    assert (big["count"], big["nodes"], big["topology"], big["pool"]) == (4, 2, "infiniband", "ray")
    assert big["simulated"] is True and big["usd_per_hour"] == 0  # simulated: never billed
    held = {n["node"]: n for n in _nodes(rfleet)}
    used = sorted(k for k, n in held.items() if n["held_by"] == ["big"])
    assert len(used) == 2 and all(held[k]["free"] == 0 for k in used)

    # a second 2-node cluster: only one whole node is left -> refused at once, with the reason
    t0 = time.monotonic()
    r = rfleet("launch", "--gpu", "H100", "--count", "4", "--nodes", "2", "--network",
               "infiniband", "--name", "big2", "-y")
    assert r.returncode == 2 and time.monotonic() - t0 < 30
    (line,) = error_lines(r.stderr)
    assert "need 4 H100-SXM (2 on each of 2 node(s))" in line
    assert "held whole by cluster big" in line

    # one-node clusters pack onto the free node; none may use big's nodes
    one = rfleet.json("launch", "--gpu", "H100", "--count", "1", "--name", "one", "-y", "--json")
    two = rfleet.json("launch", "--gpu", "H100", "--count", "1", "--name", "two", "-y", "--json")
    rows = {n["node"]: n for n in _nodes(rfleet)}
    spare = next(k for k in rows if k not in used)
    assert rows[spare]["held_by"] == ["one", "two"] and rows[spare]["free"] == 0
    assert one["nodes"] == two["nodes"] == 1
    r = rfleet("launch", "--gpu", "H100", "--count", "1", "--name", "three", "-y")
    assert r.returncode == 2 and "held whole by cluster big" in r.stderr

    # other types, fabrics and impossible shapes: refused naming the field
    for args, text in ((["--gpu", "A100", "--count", "1"], "the pool has no A100-80GB"),
                       (["--gpu", "H100", "--count", "4", "--nodes", "2", "--network",
                         "ethernet"], "has no ethernet to other nodes"),
                       (["--gpu", "H100", "--count", "16", "--nodes", "2"], "16 H100-SXM")):
        r = rfleet("launch", *args, "-y")
        assert r.returncode == 2 and len(error_lines(r.stderr)) == 1, (args, r.stderr)
        assert text in r.stderr, (args, r.stderr)
    rfleet.ok("stop", "big")
    # the stop frees big's nodes in the store at once; a node Ray itself reports not alive at
    # this moment (a raylet missing its health checks on a loaded machine) shows nothing free,
    # which is Ray's word, not a hold: CI once saw that here
    after = [n for n in _nodes(rfleet) if n["node"] in used]
    assert after and all(not n["held_by"] for n in after), after
    _wait_free(rfleet, set(used))


def test_its_nodes_see_this_machines_files_so_nothing_would_travel(ray_pool: RayPool,
                                                                    tmp_path: Path) -> None:
    """The detection itself (backends/shipping.py through a task pinned to each node): every
    node reads the probe's fresh content (a node reading other content says no: the agent's
    `sees`, tests/unit/test_travel.py). One probe: each costs a Ray client (~8 s here)."""
    from gpufleet.backends import shipping
    from gpufleet.backends.ray import RayBackend

    engine = RayBackend(ray_pool.name, ray_pool.address, ray_local.token_path(ray_pool.cfg))
    nodes = [n.id for n in engine.discover()]
    found = shipping.probe(engine, nodes, tmp_path)
    assert found is not None and found.seen == dict.fromkeys(nodes, True) and not found.ships
    assert len(nodes) == NODES and list(tmp_path.iterdir()) == []  # the probe file removed


# ------------------------------------------------------------------------------ jobs


def test_two_node_ddp_gpt_through_ray_fails_fast_on_a_lost_node_and_continues(
        rfleet: Fleet, ray_pool: RayPool) -> None:
    """One torchrun per node through Ray, c10d on the head, telemetry from each node's agent;
    then a worker node is killed mid-training: the job notices within seconds, its cluster
    takes a free node in place of the lost one and the restart resumes from the checkpoint."""
    # the example, held at step 12 in its first run until the kill ends it (held_gpt.py): a
    # first run that could reach its end before the kill lands would judge a race
    rfleet.ok("run", str(WORKERS / "held_gpt.py"), "--gpu", "H100", "--count", "4", "--nodes",
              "2", "--network", "infiniband", "--name", "gpt2n", "--max-restarts", "1", "-d",
              "-y", "--", "--hold-at", "12", "--steps", "30", "--checkpoint-every", "5")
    deadline = time.monotonic() + 240
    while not any(e["kind"] == "checkpoint" for e in _events(rfleet, "gpt2n")):
        assert time.monotonic() < deadline, _events(rfleet, "gpt2n")
        time.sleep(1.0)
    cluster = rfleet.status("gpt2n")["cluster"]
    held = {n["node"] for n in _nodes(rfleet) if n["held_by"] == [cluster]}
    victim = sorted(held - {"head"})[0]
    index = int(victim.removeprefix("worker"))
    killed_at = time.time()
    ray_local.kill_node(ray_pool.cfg, victim)
    try:
        st = rfleet.wait_ended("gpt2n", 300)
        events = _events(rfleet, "gpt2n")
        kinds = [e["kind"] for e in events]
        failed = next(e for e in events if e["kind"] == "worker_failed")
        assert f"NodeLostError: node {victim}" in failed["reason"]
        # Ray declares a node dead after missed health checks, later on a loaded machine: the
        # bound catches a job that never noticed (it would wait for its hang timeout, 5 min)
        noticed = failed["time"] - killed_at
        assert noticed < 120, f"the job noticed the lost node {noticed:.0f} s after the kill"
        replaced = next(e for e in events if e["kind"] == "node_replaced")
        found = re.search(rf"node {victim} lost; replaced by node \S+ \(([\d.]+)\)",
                          replaced["reason"])
        assert found, replaced["reason"]
        replacement = re.search(r"replaced by node (\S+) \(", replaced["reason"])
        assert replacement, replaced["reason"]
        assert "resumed" in kinds and st["status"] == "succeeded", (
            st, [(e["kind"], e.get("reason")) for e in events],
            (rfleet.home / "jobs" / "gpt2n" / "job.log").read_text()[-3000:])
        assert st["step"] == 30 and st["world_size"] == 4
        assert st["loss"] < st["first_loss"] - 0.5, st  # it learned

        job_dir = rfleet.home / "jobs" / "gpt2n"
        log = (job_dir / "job.log").read_text()
        assert "all-reduce check passed (10 == 10)" in log  # 0+1+2+3+4 over 4 ranks on 2 nodes
        # lines carry (node, rank): the example prints from rank 0; torchrun speaks on each node
        assert re.search(r"^\[head rank0\]:step 30/30 loss", log, re.M), log[-2000:]
        # a cluster's nodes are named by their place in it (head, worker1: `ssh NAME-worker1`);
        # after the heal its worker1 is the replacement, at the replacement's address
        starts = re.findall(r"torchrun started on 2 node\(s\): head \([\d.]+\), worker1 \(([\d.]+)\)",
                            log)
        assert len(starts) == 2 and starts[1] == found.group(1) != starts[0], starts
        assert "step 30/30" in (job_dir / "logs" / "rank0.log").read_text()
        # the loopback Ray's nodes see this machine's files: detected by each node's agent
        # before each run (and at submission, or --max-restarts without --checkpoint-to would
        # be refused), so nothing was shipped
        assert log.count(f"workdir: every node sees {rfleet.cwd}; nothing shipped") == 2, log
        assert "shipped to" not in log
        plan = json.loads((job_dir / "ray-plan.json").read_text())  # the restart's plan
        heads = [n for n in plan["nodes"] if "is_host=1" in n["argv"]]
        assert len(plan["nodes"]) == 2 and len(heads) == 1
        endpoint = plan["nodes"][1]["argv"][plan["nodes"][1]["argv"].index("--rdzv-endpoint") + 1]
        assert endpoint.startswith(heads[0]["address"] + ":")
        # device telemetry came from each node's agent, and every rank's metrics from its own
        # reports, both labelled with the pool's node they ran on (`pool list`), not "local":
        # the two the cluster held, then the survivor and the replacement
        store = Store(url=f"sqlite:///{rfleet.home / 'state.db'}")
        with store.read() as s:
            nodes = {n for (n,) in s.execute(sql_text(
                "select distinct node from metrics where job='gpt2n' and name='gpu_utilization'"))}
            rank_nodes = {n for (n,) in s.execute(sql_text(
                "select distinct node from metrics where job='gpt2n' and name='step_time_seconds'"
                " and rank >= 0"))}
        store.close()
        assert nodes == rank_nodes == held | {replacement.group(1)}, (nodes, rank_nodes, held)
    finally:
        ray_local.start_node(ray_pool.cfg, index)  # the pool whole again for later tests
        _wait_healthy(rfleet, NODES)
    # the cluster made for the job is gone, its nodes free again
    assert not rfleet.clusters()
    assert len(_wait_free(rfleet)) == NODES


# ------------------------------------------------------------------------------ sim pools


def test_a_warm_job_forks_its_ranks_on_every_ray_node_and_again_after_a_restart(
        rfleet: Fleet) -> None:
    """`--warm` through Ray: each node agent's torchrun is gpufleet's warm launcher, whose two
    ranks fork from a forkserver with torch imported, in the first run and in the run after a
    rank's failure, which restarts inside the running launchers (the decision reaches each
    node's actor: backends/node_restart.py)."""
    rfleet.ok("run", str(WORKERS / "warm_probe.py"), "--gpu", "H100", "--count", "4", "--nodes",
              "2", "--network", "infiniband", "--name", "rw", "--max-restarts", "1", "--warm",
              "-d", "-y", "--", "--fail-first-run", "4")
    final = rfleet.wait_ended("rw", 300)
    log = rfleet.ok("logs", "rw").stdout
    assert final["status"] == "succeeded", (_events(rfleet, "rw"), log[-3000:])
    found = re.findall(r"\[(head|worker\d) rank\d\]:probe rank (\d) warm=(\w+) name=__main__ "
                       r"argv=\['\S+', '4'\] path0=\S+ forkserver_parent=(\w+) frozen=\d+ "
                       r"run=(\d)", log)
    assert sorted((rank, run) for _, rank, _, _, run in found) == [
        (str(r), str(n)) for r in range(4) for n in (1, 2)], log[-3000:]
    assert {(warm, forked) for _, _, warm, forked, _ in found} == {("True", "True")}, found
    assert len({node for node, *_ in found}) == 2, found  # the ranks of two nodes
    assert "warm start off" not in log
    assert len(re.findall(r"\[(head|worker\d)\]: gpufleet: run 2: the workers restart inside "
                          r"the running launcher", log)) == 2, log[-3000:]
    assert log.count("torchrun started on 2 node(s)") == 1, log[-3000:]
    restarting = next(e["reason"] for e in _events(rfleet, "rw") if e["kind"] == "restarting")
    assert restarting.startswith("rank 3 failed (exit code 1)"), restarting
    assert "failed to shutdown the rendezvous" not in log.split("restart 1:")[-1], log[-3000:]


def test_sim_pool_of_16000_gpus_plans_and_reserves_but_never_runs(fleet: Fleet) -> None:
    fleet.ok("pool", "add", "sim", "--name", "fleet", "--shape", "1000xH100:8",
             "--shape", "600xA100:8", "--shape", "400xRTX4090:4:ethernet")
    listing = fleet.json("pool", "list", "fleet", "--json")[0]
    assert sum(n["count"] for n in listing["nodes"]) == 8000 + 4800 + 1600
    assert all(n["simulated"] for n in listing["nodes"])
    table = fleet.ok("pool", "list", "fleet").stdout
    assert "1000 nodes" in table  # large pools are listed as groups
    c = fleet.json("launch", "--gpu", "H100", "--count", "64", "--name", "huge", "-y", "--json")
    assert (c["nodes"], c["topology"], c["simulated"], c["usd_per_hour"]) == (
        8, "infiniband", True, 0)
    r = fleet("run", "--cluster", "huge", str(EXAMPLES / "gpt.py"))
    assert r.returncode == 2 and "a simulated pool only plans and reserves" in r.stderr
    r = fleet("launch", "--gpu", "RTX4090", "--count", "8", "--nodes", "2", "--network",
              "infiniband", "-y")
    assert r.returncode == 2 and "has no infiniband to other nodes" in r.stderr
    fleet.ok("pool", "use", "local")
    local = fleet.json("launch", "--gpu", "cpu", "--count", "1", "-y", "--json")
    assert local["pool"] == "local"
    r = fleet("pool", "remove", "fleet")
    assert r.returncode == 2 and "stop them first" in r.stderr
