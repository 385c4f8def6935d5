"""Clusters through a team server (/api/v1/clusters): two users launching on a sim pool get
disjoint devices, see only their own clusters, cannot stop each other's, and a stop gives the
devices back; refusals are the API's one-line errors."""

from __future__ import annotations

import json
import sqlite3
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fleet_helpers import Fleet, serving

Call = Callable[..., tuple[int, Any]]


@pytest.fixture
def sim_server(make_fleet: Callable[[str, int], Fleet]) -> Iterator[tuple[str, Fleet]]:
    """`gpufleet server` on a free loopback port whose default pool is 4 simulated nodes of 8
    H100 each."""
    home = make_fleet("server", 2)
    home.home.mkdir(parents=True)
    home.ok("pool", "add", "sim", "--shape", "4xH100-SXM:8:infiniband")
    yield from serving(home)


def caller(url: str, token: str | None) -> Call:
    def call(method: str, path: str, body: Any = None) -> tuple[int, Any]:
        req = urllib.request.Request(url + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {token}"}
                                                 if token else {})})
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    return resp.status, json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())
            except urllib.error.URLError:  # it prints its address before it listens
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    return call


def devices(row: dict[str, Any]) -> set[tuple[str, str]]:
    return {(node, d) for node, ds in row["placements"].items() for d in ds}


def one_line_error(status: int, got: Any, want_status: int, *words: str) -> None:
    assert status == want_status, (status, got)
    assert set(got) == {"error", "kind"} and "\n" not in got["error"], got
    for w in words:
        assert w in got["error"], got


def test_two_users_share_a_sim_pool_through_the_api(sim_server: tuple[str, Fleet]) -> None:
    url, srv = sim_server
    admin = caller(url, (srv.home / "admin-token").read_text().strip())
    tokens = {}
    for name in ("alice", "bob"):
        status, got = admin("POST", "/api/v1/admin/users", {"name": name, "team": "ml"})
        assert status == 200, got
        tokens[name] = got["token"]
    alice, bob = caller(url, tokens["alice"]), caller(url, tokens["bob"])

    made: dict[str, dict[str, Any]] = {}
    for who, call, spec in (("alice", alice, {"gpu": "H100", "count": 8}),
                            ("bob", bob, {"gpu": "H100", "count": 16, "nodes": 2}),
                            ("alice", alice, {"gpu": "H100", "count": 4}),
                            ("bob", bob, {"gpu": "H100", "count": 2})):
        status, got = call("POST", "/api/v1/clusters", {"spec": spec})
        assert status == 200, got
        assert got["user"] == who and got["pool"] == "sim" and got["simulated"] is True
        assert got["status"] == "running" and got["count"] == spec["count"]
        assert len(devices(got)) == spec["count"], got
        made[got["name"]] = got
    every = [d for row in made.values() for d in devices(row)]
    assert len(every) == len(set(every)) == 30  # no device given twice
    big = next(r for r in made.values() if r["count"] == 16)
    others = {n for r in made.values() if r is not big for n, _ in devices(r)}
    assert set(big["placements"]).isdisjoint(others)  # a multi-node cluster's nodes are its own

    one_line_error(*bob("POST", "/api/v1/clusters", {"spec": {"gpu": "H100", "count": 16,
                                                               "nodes": 2}}),
                   409, "need 16 H100-SXM", "[pool sim")
    one_line_error(*alice("POST", "/api/v1/clusters", {"spec": {"gpu": "B200"}}), 400, "gpu")
    one_line_error(*alice("POST", "/api/v1/clusters", {"spec": {"gpu": "H100", "pool": "nope"}}),
                   404, "no pool named 'nope'")
    one_line_error(*alice("POST", "/api/v1/clusters", {"spec": {"gpu": "H100", "count": 9,
                                                                 "nodes": 2}}), 400, "nodes")
    one_line_error(*caller(url, None)("GET", "/api/v1/clusters"), 401, "token")

    status, mine = alice("GET", "/api/v1/clusters")
    assert status == 200 and {r["user"] for r in mine} == {"alice"} and len(mine) == 2
    one_line_error(*alice("GET", "/api/v1/clusters?user=bob"), 403, "only an admin")
    status, everyone = admin("GET", "/api/v1/clusters")
    assert status == 200 and {r["name"] for r in everyone} == set(made)

    eight = next(n for n, r in made.items() if r["count"] == 8)
    one_line_error(*bob("DELETE", f"/api/v1/clusters/{eight}"), 403, "it is not yours (bob)")
    assert eight in {r["name"] for r in alice("GET", "/api/v1/clusters")[1]}
    status, got = bob("DELETE", "/api/v1/clusters/no-such")
    one_line_error(status, got, 404, "no-such")
    assert not any(n in got["error"] for n in made), got  # nor names others' clusters

    # the pool is full for a whole node until alice's 8 are given back
    one_line_error(*bob("POST", "/api/v1/clusters", {"spec": {"gpu": "H100", "count": 8}}), 409)
    status, got = alice("DELETE", f"/api/v1/clusters/{eight}")
    assert status == 200 and got["status"] == "stopped", got
    assert eight not in {r["name"] for r in admin("GET", "/api/v1/clusters")[1]}
    one_line_error(*alice("DELETE", f"/api/v1/clusters/{eight}"), 409, "stopped")
    status, again = bob("POST", "/api/v1/clusters", {"spec": {"gpu": "H100", "count": 8}})
    assert status == 200, again
    assert devices(again) == devices(made[eight])  # the freed node, whole
    # launched clusters count against the team's quota: ml holds 30 - 8 + 8 = 30 H100 now
    status, _ = admin("PUT", "/api/v1/admin/quotas", {"team": "ml", "gpu": "H100",
                                                      "devices": 31})
    assert status == 200
    one_line_error(*alice("POST", "/api/v1/clusters", {"spec": {"gpu": "H100", "count": 2}}),
                   409, "team ml's quota is 31 x H100-SXM at once and 30 are in use")
    status, _ = admin("PUT", "/api/v1/admin/quotas", {"team": "ml", "gpu": "H100",
                                                      "devices": None})
    assert status == 200

    with sqlite3.connect(f"file:{srv.home / 'state.db'}?mode=ro", uri=True) as db:
        held = db.execute("SELECT c.name, c.user, count(*) FROM reservations r JOIN clusters c "
                          "ON c.id = r.cluster_id GROUP BY c.id").fetchall()
        stopped = db.execute("SELECT status, user FROM clusters WHERE name = ?",
                             (eight,)).fetchall()
    db.close()
    assert sorted(held) == sorted([(n, r["user"], r["count"]) for n, r in made.items()
                                   if n != eight] + [(again["name"], "bob", 8)])
    assert stopped == [("stopped", "alice")]

    status, audit = admin("GET", "/api/v1/admin/audit")
    assert status == 200
    did = {(e["user"], e["action"], e["subject"]) for e in audit}
    assert {("alice", "launch", eight), ("alice", "stop", eight),
            ("bob", "launch", again["name"])} <= did
    assert ("bob", "stop", eight) not in did  # refused: not recorded as done
