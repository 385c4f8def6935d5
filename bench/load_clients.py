"""The clients and the checker of bench/server_load.py.

A client is a thread with one keep-alive HTTP connection to the server, acting as one user:
launch a small cluster on the sim pool, submit a job that must queue, list jobs, list clusters,
cancel the job, and stop its oldest cluster once it holds more than `hold`; over and over until
told to stop. Every call's latency is kept by operation, and every answer is judged: a 2xx
(checked for what it must say), an expected refusal (a full pool: 409 AllocationError), or an
error.

Two checks that no device is given twice, independent of each other:
- `Grants`, on the clients' side: the devices each launch answered with, against those of the
  clusters not yet asked to stop (a cluster leaves before its DELETE is sent, so the check
  cannot be fooled by a DELETE whose answer is still on the way);
- `Sampler`, on the store: every second, in one read transaction, every reservation and every
  running cluster: no (pool, node, device) twice, no reservation of a stopped cluster, each
  cluster holding exactly its count on its own pool, a multi-node cluster's nodes its alone.
"""

from __future__ import annotations

import http.client
import json
import random
import sqlite3
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OPS = ("launch", "submit", "list_jobs", "list_clusters", "cancel", "stop")
# (GPUs, nodes, weight): small one-node clusters, now and then two whole nodes
SIZES = [(1, 1, 0.3), (2, 1, 0.25), (4, 1, 0.2), (8, 1, 0.15), (16, 2, 0.1)]
KEEPALIVE_S = 4.0  # uvicorn closes an idle connection after 5 s: open a new one before that

Device = tuple[str, str, str]  # (pool, node, device)


@dataclass
class Tally:
    """What the clients saw, merged at the end (each client keeps its own: no lock)."""

    seconds: dict[str, list[float]] = field(default_factory=lambda: {op: [] for op in OPS})
    calls: list[tuple[float, str, float]] = field(default_factory=list)  # (sent at, op, seconds)
    refused: Counter[str] = field(default_factory=Counter)  # expected refusals, by operation
    errors: list[str] = field(default_factory=list)  # "op: HTTP status: what it said"

    def merge(self, other: Tally) -> None:
        for op, xs in other.seconds.items():
            self.seconds[op].extend(xs)
        self.calls.extend(other.calls)
        self.refused.update(other.refused)
        self.errors.extend(other.errors)


class Api:
    """One user's keep-alive connection to the server."""

    def __init__(self, host: str, port: int, token: str):
        self.host, self.port, self.token = host, port, token
        self.conn: http.client.HTTPConnection | None = None
        self.used_at = 0.0

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any, float]:
        """(HTTP status, JSON answer, seconds from sending to the whole answer read)."""
        if self.conn is None or time.monotonic() - self.used_at > KEEPALIVE_S:
            self.close()
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        t0 = time.perf_counter()
        try:
            self.conn.request(method, path, body=data, headers=headers)
            resp = self.conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        took = time.perf_counter() - t0
        self.used_at = time.monotonic()
        return resp.status, json.loads(raw or b"null"), took

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def devices_of(row: dict[str, Any]) -> frozenset[Device]:
    return frozenset((row["pool"], node, dev) for node, devs in row["placements"].items()
                     for dev in devs)


class Grants:
    """The devices of the clusters the clients hold, as the launches answered."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: dict[str, frozenset[Device]] = {}  # cluster -> devices
        self.owner: dict[Device, str] = {}
        self.twice: list[str] = []  # a device granted while another cluster held it
        self.granted = 0

    def grant(self, name: str, devices: frozenset[Device]) -> None:
        with self.lock:
            self.granted += 1
            for d in devices:
                if d in self.owner:
                    self.twice.append(f"{'/'.join(d)}: {name} while {self.owner[d]} held it")
                self.owner[d] = name
            self.held[name] = devices

    def release(self, name: str) -> frozenset[Device]:
        with self.lock:
            devices = self.held.pop(name, frozenset())
            for d in devices:
                if self.owner.get(d) == name:
                    del self.owner[d]
            return devices

    def restore(self, name: str, devices: frozenset[Device]) -> None:
        """A stop that failed: the cluster still holds its devices."""
        with self.lock:
            self.held[name] = devices
            for d in devices:
                self.owner[d] = name


class Stopped(Exception):
    """The run is over: the client sends nothing more."""


class Client(threading.Thread):
    def __init__(self, index: int, api: Api, grants: Grants, script: str, pause_s: float,
                 hold: int, stop: threading.Event, seed: int):
        super().__init__(name=f"client-{index}", daemon=True)
        self.api, self.grants, self.script = api, grants, script
        self.pause_s, self.hold, self.stopping = pause_s, hold, stop
        self.rng = random.Random(seed)
        self.tally = Tally()
        self.mine: list[str] = []  # clusters this client holds, oldest first
        self.cycles = 0

    def _call(self, op: str, method: str, path: str, body: Any = None) -> Any | None:
        """The answer of a 2xx; None for a refusal (counted) or an error (kept)."""
        if self.pause_s:
            self.stopping.wait(self.rng.uniform(0.5, 1.5) * self.pause_s)
        if self.stopping.is_set():  # not a request more: all clients at once would be a burst
            raise Stopped
        try:
            status, got, took = self.api.call(method, path, body)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.tally.errors.append(f"{op}: {type(exc).__name__}: {exc}")
            return None
        self.tally.seconds[op].append(took)
        self.tally.calls.append((time.time() - took, op, took))
        if 200 <= status < 300:
            return got
        kind = got.get("kind") if isinstance(got, dict) else None
        if op == "launch" and status == 409 and kind == "AllocationError":
            self.tally.refused[op] += 1  # the pool is full for that request: expected
        else:
            what = got.get("error") if isinstance(got, dict) else got
            self.tally.errors.append(f"{op}: HTTP {status} {kind}: {what}")
        return None

    def _bad(self, op: str, why: str) -> None:
        self.tally.errors.append(f"{op}: {why}")

    def launch(self) -> None:
        count, nodes = self.rng.choices([(c, n) for c, n, _ in SIZES],
                                        weights=[w for *_, w in SIZES])[0]
        spec: dict[str, Any] = {"gpu": "H100", "count": count}
        if nodes > 1:
            spec.update(nodes=nodes, network="infiniband")
        got = self._call("launch", "POST", "/api/v1/clusters", {"spec": spec})
        if got is None:
            return
        devices = devices_of(got)
        if got["status"] != "running" or len(devices) != count or got["nodes"] != nodes:
            self._bad("launch", f"asked {count} x H100 on {nodes} node(s), got {got}")
        self.grants.grant(got["name"], devices)
        self.mine.append(got["name"])

    def stop_oldest(self) -> None:
        name = self.mine.pop(0)
        devices = self.grants.release(name)  # before the DELETE goes: see the module's doc
        try:
            got = self._call("stop", "DELETE", f"/api/v1/clusters/{name}")
        except Stopped:  # not sent: it still holds them
            self.grants.restore(name, devices)
            self.mine.insert(0, name)
            raise
        if got is None:
            self.grants.restore(name, devices)
            self.mine.insert(0, name)
        elif got["status"] != "stopped":
            self._bad("stop", f"{name}: {got}")

    def cycle(self) -> None:
        self.launch()
        job = self._call("submit", "POST", "/api/v1/jobs", {"spec": {
            "script": self.script, "cluster": {"gpu": "cpu", "count": 1, "pool": "local"}}})
        if job is not None and job["status"] != "queued":
            self._bad("submit", f"the local pool is held, yet the job is {job['status']}")
        jobs = self._call("list_jobs", "GET", "/api/v1/jobs")
        if job is not None and jobs is not None and \
                job["name"] not in {r["name"] for r in jobs}:
            self._bad("list_jobs", f"{job['name']} is not in the caller's list")
        mine = self._call("list_clusters", "GET", "/api/v1/clusters")
        if mine is not None and not set(self.mine) <= {r["name"] for r in mine}:
            self._bad("list_clusters", f"{sorted(set(self.mine) - {r['name'] for r in mine})} "
                      "missing from the caller's list")
        if job is not None:
            gone = self._call("cancel", "POST", f"/api/v1/jobs/{job['name']}/cancel")
            if gone is not None and gone["status"] != "cancelled":
                self._bad("cancel", f"{job['name']}: {gone}")
        while len(self.mine) > self.hold and not self.stopping.is_set():
            self.stop_oldest()
        self.cycles += 1

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                self.cycle()
        except Stopped:
            pass
        except Exception as exc:  # a bug in the client: kept, not a silent dead thread
            self.tally.errors.append(f"client: {type(exc).__name__}: {exc}")
        finally:
            self.api.close()


@dataclass
class Sample:
    at: float
    clusters: int
    reservations: int
    problems: list[str]
    held: dict[str, frozenset[Device]]  # running cluster -> its devices


def sample(db: Path, at: float) -> Sample:
    """One consistent look at the store's reservations and running clusters."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30, isolation_level=None)
    try:
        con.execute("BEGIN")
        rows = con.execute("SELECT id, name, pool, count, nodes FROM clusters "
                           "WHERE status IN ('pending', 'running')").fetchall()
        res = con.execute("SELECT cluster_id, pool, node_id, device_id FROM reservations").fetchall()
        con.execute("COMMIT")
    finally:
        con.close()
    running = {cid: (name, pool or "local", count, nodes) for cid, name, pool, count, nodes in rows}
    problems: list[str] = []
    owner: dict[Device, int] = {}
    held: dict[int, set[Device]] = {cid: set() for cid in running}
    on_node: dict[tuple[str, str], set[int]] = {}
    for cid, pool, node, dev in res:
        key = (pool, node, dev)
        if key in owner:
            problems.append(f"{'/'.join(key)} held by clusters {owner[key]} and {cid}")
        owner[key] = cid
        if cid not in running:
            problems.append(f"{'/'.join(key)} still reserved by stopped cluster {cid}")
            continue
        if pool != running[cid][1]:
            problems.append(f"cluster {running[cid][0]} holds {'/'.join(key)} of another pool")
        held[cid].add(key)
        on_node.setdefault((pool, node), set()).add(cid)
    for cid, (name, _pool, count, nodes) in running.items():
        if len(held[cid]) != count:
            problems.append(f"cluster {name} holds {len(held[cid])} devices, not its {count}")
        if nodes > 1:
            for where in {(p, n) for p, n, _ in held[cid]}:
                if on_node[where] != {cid}:
                    problems.append(f"node {'/'.join(where)} of multi-node cluster {name} shared")
    return Sample(at, len(running), len(res), problems,
                  {running[cid][0]: frozenset(ds) for cid, ds in held.items()})


class Sampler(threading.Thread):
    """`sample` every second until stopped; and the server's RSS (psutil) at each."""

    def __init__(self, db: Path, server_pid: int, stop: threading.Event):
        super().__init__(name="sampler", daemon=True)
        import psutil

        self.db, self.proc, self.stopping = db, psutil.Process(server_pid), stop
        self.samples: list[Sample] = []
        self.rss: list[tuple[float, int]] = []  # (time, bytes)
        self.cpu_s: list[float] = []  # the server's CPU time (user + system) at each sample
        self.failures: list[str] = []

    def once(self) -> Sample:
        s = sample(self.db, time.time())
        self.samples.append(s)
        self.rss.append((s.at, self.proc.memory_info().rss))
        t = self.proc.cpu_times()
        self.cpu_s.append(t.user + t.system)
        return s

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            try:
                self.once()
            except Exception as exc:  # kept and reported, the run goes on
                self.failures.append(f"{type(exc).__name__}: {exc}")
