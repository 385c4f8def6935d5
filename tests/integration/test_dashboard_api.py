"""The dashboard's JSON API and /metrics against a real job and a real server, and its access
rules: loopback without a token, any other address only with it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fleet_helpers import WORKERS, Fleet
from prometheus_client.parser import text_string_to_metric_families


@pytest.fixture
def dashboard(fleet: Fleet) -> Iterator[str]:
    """`gpufleet dashboard --port 0` of the fleet's home; yields its base URL."""
    proc = fleet.popen("dashboard", "--port", "0")
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "gpufleet dashboard on http://127.0.0.1:" in line, line
        yield line.split(" on ", 1)[1].split()[0]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_api_and_metrics_follow_a_running_job(fleet: Fleet, dashboard: str) -> None:
    """The job outlasts any test (50 minutes at least, stopped at the end): what is asked of a
    running job must not race the job's own end on a loaded machine."""
    fleet.ok("run", str(WORKERS / "telemetry_job.py"), "--gpu", "cpu", "--count", "2",
             "--name", "api", "--detach", "-y", "--", "--steps", "300000", "--step-sleep", "0.01")
    fleet.wait_for_step("api", 20)
    time.sleep(2.5)  # a few device samples
    with httpx.Client(base_url=dashboard, timeout=10) as http:
        clusters = http.get("/api/clusters").json()
        assert [c["job"] for c in clusters] == ["api"] and clusters[0]["devices"] == ["cpu0", "cpu1"]
        jobs = http.get("/api/jobs").json()
        assert jobs[0]["job"] == "api" and jobs[0]["status"] == "running"

        detail = http.get("/api/jobs/api").json()
        assert detail["step"] >= 20 and detail["eta_s"] > 0
        assert detail["projected_cost_usd"] > detail["cost_usd"] > 0
        assert set(detail["latest"]) >= {"cpu0", "cpu1", "rank 0", "rank 1"}
        assert 0 < detail["latest"]["cpu0"]["gpu_utilization"] <= 1
        assert detail["latest"]["rank 0"]["comm_seconds"] > 0  # DDP's hook measured it
        assert detail["nodes"]["rank 1"] == detail["nodes"]["cpu0"] == "local"  # this host

        first = http.get("/api/jobs/api/series", params={"names": "job_samples_per_second"}).json()
        points = first["series"]["job_samples_per_second"]["job"]
        assert len(points) >= 3
        newer: list[list[float]] = []
        deadline = time.monotonic() + 60
        while not newer and time.monotonic() < deadline:  # the next sample, however busy
            time.sleep(0.5)
            more = http.get("/api/jobs/api/series", params={
                "names": "job_samples_per_second", "since": points[-1][0]}).json()
            newer = more["series"]["job_samples_per_second"].get("job", [])
        assert newer and all(t > points[-1][0] for t, *_ in newer)  # only what is new
        # each point carries the step rank 0 had reported by then (the page's step axis)
        steps = [p[2] for p in points + newer]
        assert all(s is not None and s >= 1 for s in steps) and steps == sorted(steps)
        assert steps[-1] <= fleet.status("api")["step"]

        before = time.time()
        m = _metrics(http.get("/metrics").text)
        assert http.get("/api/jobs/nope").status_code == 404
        assert http.post("/api/jobs/api").status_code == 405  # read-only API
        # no file outside the page's folder: app.py sits right beside static/ (httpx would
        # normalise "/static/../app.py" away, so the dots are sent encoded)
        assert http.get("/static/app.js").status_code == 200
        assert http.get("/static/%2e%2e/app.py").status_code == 404
        assert http.get("/static/%2e%2e%2fapp.py").status_code == 404
        # DNS rebinding: a page whose own name resolves to 127.0.0.1 gets nothing
        assert http.get("/api/jobs", headers={"host": "evil.example"}).status_code == 403

    def one(name: str, **labels: str) -> float:
        hits = [v for lab, v in m[name] if all(lab.get(k) == w for k, w in labels.items())]
        assert len(hits) == 1, (name, labels, m.get(name))
        return hits[0]

    cluster = clusters[0]["name"]
    assert one("gpufleet_job_running", gpufleet_job="api") == 1.0
    util = [v for lab, v in m["gpufleet_gpu_utilization"] if lab["gpufleet_job"] == "api"]
    assert len(util) == 2 and all(0 < v <= 1 for v in util)
    assert {lab["gpu"] for lab, _ in m["gpufleet_gpu_utilization"]} == {"cpu0", "cpu1"}
    assert one("gpufleet_step_time_seconds", gpufleet_job="api", rank="1", node="local") > 0
    # the same function priced the page and /metrics: equal up to the time between the calls
    rate = clusters[0]["usd_per_hour"]
    status = fleet.status("api")
    job_cost = one("gpufleet_job_cost_usd", gpufleet_job="api", cluster=cluster)
    assert abs(job_cost - status["cost_usd"]) <= rate * (time.time() - before + 1) / 3600
    assert one("gpufleet_cluster_usd_per_hour", cluster=cluster) == rate
    assert one("gpufleet_job_samples_per_second", gpufleet_job="api") > 0
    fleet.ok("stop", "api")

    # once it ended: its outcome stays for 5 minutes, its devices' and ranks' gauges go (the
    # devices may run the next job already: `sum by (gpu)` would count them twice)
    ended = _metrics(httpx.get(dashboard.rstrip("/") + "/metrics", timeout=10).text)
    mine = [(name, lab) for name, rows in ended.items() for lab, _ in rows
            if lab.get("gpufleet_job") == "api"]
    assert {"gpufleet_job_running", "gpufleet_job_cost_usd", "gpufleet_job_step"} <= {
        name for name, _ in mine}
    assert [v for lab, v in ended["gpufleet_job_running"] if lab["gpufleet_job"] == "api"] == [0]
    assert [name for name, lab in mine if "gpu" in lab or "rank" in lab] == []


def test_loopback_dashboard_refuses_a_name_it_does_not_know(fleet: Fleet) -> None:
    r = fleet("dashboard", "nosuchjob", "--port", "0", timeout=30)
    assert r.returncode == 2 and "no cluster or job called 'nosuchjob'" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_busy_port_is_one_clear_line(fleet: Fleet, dashboard: str) -> None:
    port = dashboard.rstrip("/").rsplit(":", 1)[1]
    r = fleet("dashboard", "--port", port, timeout=30)
    assert r.returncode == 2 and "cannot listen on 127.0.0.1:" in r.stderr
    assert "--port 0" in r.stderr and "Traceback" not in r.stderr


def _can_make_namespaces() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


def test_any_other_address_needs_the_token(fleet: Fleet, tmp_path: Path) -> None:
    """Bound to a non-loopback address (inside a private network namespace, so nothing is
    exposed): every page, API and metrics request without the token is refused."""
    if not _can_make_namespaces():  # the same rules on loopback: test_a_token_app_refuses...
        pytest.skip("needs root to create a network namespace (unshare -n)")
    r = subprocess.run(["unshare", "-n", sys.executable, str(WORKERS / "ns_dashboard_probe.py")],
                       env=fleet.env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    assert out["no_token"] == {"": 401, "api/jobs": 401, "metrics": 401, "static/app.js": 401}
    assert out["wrong_token"] == 401
    assert out["bearer"] == {"": 200, "api/jobs": 200, "metrics": 200}
    assert out["query"] == 200
    token_file = fleet.home / "dashboard-token"
    assert token_file.read_text().strip() == out["token"]
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert "Bearer" in out["second_line"]


def test_a_token_app_refuses_every_request_without_it(tmp_path: Path) -> None:
    """The app the dashboard serves beyond loopback, on a real server on 127.0.0.1 (this part
    needs no network namespace): no token, a wrong one, a right one, and the cookie."""
    import socket
    import threading

    import uvicorn

    from gpufleet.store import Store
    from gpufleet.web.app import create_app

    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(store, token="s3cret", bound="127.0.0.1"),
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        for path in ("/", "/api/jobs", "/metrics", "/static/app.js"):
            assert httpx.get(base + path).status_code == 401, path
        assert "token" in httpx.get(base + "/").text  # a page that says what to do
        assert httpx.get(base + "/api/jobs", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert httpx.get(base + "/metrics",
                         headers={"Authorization": "Bearer s3cret"}).status_code == 200
        with httpx.Client(base_url=base) as browser:
            assert browser.get("/?token=s3cret").status_code == 200
            assert browser.get("/api/jobs").status_code == 200  # the cookie carries it now
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        store.close()


@contextmanager
def _served(app: Any) -> Iterator[str]:
    """`app` on a real server on 127.0.0.1, port 0; yields its base URL."""
    import socket
    import threading

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.started, "the server did not start in 20 s"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _two_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A job through the real supervisor loop and a real SQLite store, its workers played by the
    fake backend (no torch): model-state bytes in rank 0's reports, rank 1 failing at step 3 of
    the first run, a second run from step 1 (no checkpoint) that succeeds. Returns the store."""
    from gpufleet.backends.fake import Exit, FakeBackend, FakeRun, Pause, Send, WorkerEvent
    from gpufleet.lifecycle import clusters, jobs
    from gpufleet.spec import ClusterSpec, JobSpec
    from gpufleet.store import Store
    from gpufleet.supervise.supervisor import Supervisor

    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPUFLEET_TELEMETRY", "0")

    def handler(run: FakeRun) -> Iterator[WorkerEvent]:
        for step in range(1, 4 if run.number == 1 else 3):
            for rank in (0, 1):
                state = {"params_bytes": 4096.0 * (rank + 1), "grads_bytes": 4096.0,
                         "optimizer_bytes": 8192.0}
                yield Send({"t": time.time(), "rank": rank, "step": step, "samples": 8,
                            "loss": 2.0 / step, **state})
        yield Pause(0.3)  # the reports reach the socket before the exit is seen
        if run.number == 1:
            yield Exit(1)
        yield Exit(0)

    store = Store(url=f"sqlite:///{tmp_path}/state.db")
    backend = FakeBackend(handler)
    cluster = clusters.launch(store, ClusterSpec.parse({"gpu": "cpu", "count": 2, "name": "dev"}),
                              backend.discover())
    job = jobs.create(store, JobSpec(script="train.py", name="two", max_restarts=1), cluster, 2)
    done: list[Any] = []
    thread = threading.Thread(target=lambda: done.append(Supervisor(store, job, cluster,
                                                                    backend).run()))
    thread.start()
    thread.join(timeout=60)
    assert done and done[0].status == "succeeded", done
    return store


def test_api_index_model_state_runs_and_markers_on_both_servers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`/api` lists the routes on the dashboard and the team server; `/api/jobs` carries the
    model-state bytes `/api/jobs/NAME` (and the summary) read, from the same rows; the job's
    detail carries its runs, restart count and markers, each at rank 0's step by then."""
    from gpufleet.lifecycle import jobs
    from gpufleet.server.api import create_api
    from gpufleet.web.app import create_app

    store = _two_runs(tmp_path, monkeypatch)
    expected_state = {"0": {"params_bytes": 4096.0, "grads_bytes": 4096.0,
                            "optimizer_bytes": 8192.0},
                      "1": {"params_bytes": 8192.0, "grads_bytes": 4096.0,
                            "optimizer_bytes": 8192.0}}
    assert {str(k): v for k, v in jobs.model_state(store, "two").items()} == expected_state
    try:
        with _served(create_app(store)) as url, httpx.Client(base_url=url, timeout=10) as http:
            index = http.get("/api").json()
            assert http.get("/api/").json() == index
            assert {"path": "/api/jobs", "method": "GET"} in [
                {k: r[k] for k in ("path", "method")} for r in index]
            assert all(r["description"] for r in index)

            [listed] = http.get("/api/jobs").json()
            detail = http.get("/api/jobs/two").json()
            assert listed["model_state"] == detail["model_state"] == expected_state
            assert [(r["number"], r["cause"]) for r in detail["runs"]] == [
                (1, "start"), (2, "restart")]
            assert detail["restarts"] == 1
            [mark] = detail["markers"]
            assert (mark["kind"], mark["label"], mark["step"]) == ("restarting", "restart", 3.0)
            assert detail["runs"][0]["start"] < mark["time"] < detail["runs"][1]["start"]
            assert "restart 1 of 1" in mark["text"]  # the event's reason, for the hover

        owner = "owner-token"
        with _served(create_api(store, owner_token=owner)) as url, \
                httpx.Client(base_url=url, timeout=10) as http:
            assert http.get("/api").status_code == 401  # like every route but the version
            bearer = {"Authorization": f"Bearer {owner}"}
            index = http.get("/api/", headers=bearer).json()
            paths = {(r["method"], r["path"]) for r in index}
            assert {("GET", "/api/v1/jobs"), ("POST", "/api/v1/jobs"), ("GET", "/api/jobs"),
                    ("GET", "/metrics")} <= paths
            assert all(r["description"] for r in index)
            [listed] = http.get("/api/jobs", headers=bearer).json()
            assert listed["model_state"] == expected_state
            assert http.get("/api/jobs/two", headers=bearer).json()["runs"] == detail["runs"]
    finally:
        store.close()
