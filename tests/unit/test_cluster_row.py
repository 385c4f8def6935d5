"""`gpufleet.cluster_row`: the one row every reader of a cluster shows (`list`, `list --json`,
`launch --json`, the server's /api/v1/clusters, the state-file reader); and what a user of a
server sees of the clusters holding its pools."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpufleet import cluster_row
from gpufleet.cluster_row import KEYS, SUMMARY_KEYS, Stored
from gpufleet.server.api_clusters import OTHERS, unnamed

RUNNING = Stored(name="a", gpu="H100-SXM", count=2, nodes=1, network="nvswitch", status="running",
                 price_book="marketplace", usd_per_hour=3.6, started_at=1000.0, stopped_at=None,
                 banked_usd=None, rate_since=None, created_at=990.0, pool=None, simulated=None,
                 user=None, for_job=None)


def test_a_row_has_exactly_the_keys_in_order_and_starts_with_the_summary() -> None:
    got = cluster_row.row(RUNNING, {"n0": ["gpu0", "gpu1"]}, ("train", "running"), "ok", 1360.0)
    assert tuple(got) == KEYS
    summary = cluster_row.summary(RUNNING, {"n0": ["gpu0", "gpu1"]}, ("train", "running"), 1360.0)
    assert tuple(summary) == SUMMARY_KEYS and {k: got[k] for k in SUMMARY_KEYS} == summary


def test_a_running_cluster_row() -> None:
    got = cluster_row.row(RUNNING, {"n0": ["gpu0", "gpu1"]}, ("train", "running"), "ok", 1360.0)
    assert got["devices"] == ["gpu0", "gpu1"] and got["placements"] == {"n0": ["gpu0", "gpu1"]}
    assert (got["topology"], got["health"], got["pool"], got["simulated"]) == \
        ("nvswitch", "ok", "local", False)
    assert (got["job"], got["job_status"], got["age_s"]) == ("train", "running", 370.0)
    assert got["cost_usd"] == pytest.approx(3.6 * 360 / 3600)  # from its start, at $3.6/hour


def test_a_stopped_cluster_costs_what_it_cost_at_its_stop() -> None:
    stopped = replace(RUNNING, status="stopped", stopped_at=1000.0 + 1800, pool="sim",
                      simulated=True, user="alice", for_job="train")
    early = cluster_row.row(stopped, {}, None, "-", 5000.0)
    late = cluster_row.row(stopped, {}, None, "-", 90000.0)
    assert early["cost_usd"] == late["cost_usd"] == pytest.approx(1.8)  # half an hour
    assert (early["devices"], early["placements"], early["job"]) == ([], {}, None)
    assert (early["pool"], early["simulated"], early["user"], early["for_job"]) == \
        ("sim", True, "alice", "train")


def test_devices_on_several_nodes_are_named_by_node() -> None:
    assert cluster_row.device_ids({"n0": ["gpu0"], "n1": ["gpu0", "gpu1"]}) == \
        ["n0/gpu0", "n1/gpu0", "n1/gpu1"]
    assert cluster_row.device_ids({}) == []


def test_a_user_sees_their_own_clusters_holding_a_pool_and_no_one_elses_names() -> None:
    listed = [{"pool": "sim", "nodes": [{"node": "n0", "held_by": ["bobs-secret", "mine"]},
                                        {"node": "n1", "held_by": ["x", "y"]},
                                        {"node": "n2", "held_by": []}]},
              {"pool": "ray", "error": "pool: cannot reach the Ray head"}]
    got = unnamed(listed, {"mine"})
    assert [n["held_by"] for n in got[0]["nodes"]] == [sorted([OTHERS, "mine"]), [OTHERS], []]
    assert got[1] == listed[1]
