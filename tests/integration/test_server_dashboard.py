"""The dashboard behind a team server, in a real browser (Debian's chromium through Playwright)
against a real `gpufleet server` with real queued jobs: the sign-in form, a wrong token refused,
a user's Queue panel (their waiting job's position, estimated start and reason, and nobody
else's jobs) and Usage panel (their team's quota and budget), the HTTP-only cookie, the
sign-out; then `/metrics` with a bearer token against `gpufleet usage --json`."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from fleet_helpers import WORKERS, Fleet
from prometheus_client.parser import text_string_to_metric_families
from test_dashboard_browser import ARTIFACTS, _chromium
from test_queue import wait_all_ended
from test_team_server import as_user, ok_json
from test_team_server import server as server  # the fixture: `gpufleet server --port 0`

GATED = str(WORKERS / "gated.py")


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def one(m: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    hits = [v for lab, v in m.get(name, []) if all(lab.get(k) == w for k, w in labels.items())]
    assert len(hits) == 1, (name, labels, m.get(name))
    return hits[0]


def micro_by_user(m: dict[str, list[tuple[dict[str, str], float]]], name: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for lab, v in m.get(name, []):
        out[lab["user"]] = out.get(lab["user"], 0) + round(v * 1_000_000)
    return out


def test_a_user_signs_in_and_sees_their_queue_and_their_team(
        server: tuple[str, Fleet], make_fleet: Callable[[str, int], Fleet],
        tmp_path: Path) -> None:
    chromium = _chromium()
    from playwright.sync_api import expect, sync_playwright

    url, srv = server
    admin_token = (srv.home / "admin-token").read_text().strip()
    admin = make_fleet("admin", 2)
    r = admin("login", url, "--token-file", str(srv.home / "admin-token"))
    assert r.returncode == 0, r.stderr  # logged in: its commands go to the server
    tokens = {}
    for name in ("alice", "bob"):
        r = admin("admin", "user", "add", name, "--team", "ml")
        assert r.returncode == 0, r.stderr
        tokens[name] = r.stdout.strip()
    assert admin("admin", "quota", "set", "ml", "cpu", "3").returncode == 0
    assert admin("admin", "budget", "set", "ml", "100").returncode == 0
    users = {n: as_user(make_fleet(n, 2), url, t) for n, t in tokens.items()}
    gate = tmp_path / "gate"

    def run(who: str, name: str, count: int, *extra: str) -> str:
        r = users[who]("run", GATED, "--gpu", "cpu", "--count", str(count), "--name", name,
                       "-d", *extra, "--", str(gate))
        assert r.returncode == 0, r.stderr
        return r.stdout + r.stderr

    try:
        # a1 holds both slots for at most 5 minutes, so the waiting jobs have an estimated
        # start; bob's b1 goes first (alice is using devices now: fair share), a2 behind it.
        # Fair share moves alice's jobs back by her GPU-seconds so far (two slots: 2 s a second),
        # so b1 passes a2 once a1 has run half the time between the two submissions: however
        # slow the machine made those, a1 holds the slots (gated) until b1 has passed.
        assert "started" in run("alice", "a1", 2, "--time-limit", "5m")
        assert "queued" in run("alice", "a2", 1)
        assert "queued" in run("bob", "b1", 1)
        rows: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            rows = {r["name"]: r for r in ok_json(admin, "jobs")}
            if rows["a2"].get("est_start") and rows["b1"].get("position") == 1:
                break
            time.sleep(0.5)
        a2, b1 = rows["a2"], rows["b1"]
        assert b1["position"] == 1 and "waits for 1 CPU slot" in b1["reason"], b1
        assert a2["position"] == 2 and a2["est_start"] and "behind the job at position 1" in a2["reason"], a2

        with httpx.Client(base_url=url, timeout=30) as http:
            assert http.get("/metrics").status_code == 401
            assert http.get("/api/jobs").status_code == 401
            assert http.get("/api/v1/usage/summary").status_code == 401
            m = samples(http.get("/metrics", headers={
                "Authorization": f"Bearer {admin_token}"}).text)
            assert one(m, "gpufleet_queue_jobs", status="queued") == 2
            assert one(m, "gpufleet_queue_jobs", status="running") == 1
            assert one(m, "gpufleet_team_quota_devices", team="ml", gpu_type="cpu") == 3
            assert one(m, "gpufleet_team_devices_in_use", team="ml", gpu_type="cpu") == 2
            assert one(m, "gpufleet_team_budget_usd", team="ml") == 100
            theirs = samples(http.get("/metrics", headers={
                "Authorization": f"Bearer {tokens['bob']}"}).text)
            assert one(theirs, "gpufleet_queue_jobs", status="queued") == 1  # b1 only
            assert "gpufleet_job_running" not in theirs  # a1 is alice's
            bob = {"Authorization": f"Bearer {tokens['bob']}"}
            assert http.get("/api/jobs", headers=bob).json() == []
            assert http.get("/api/clusters", params={"all": "true"}, headers=bob).json() == []
            assert http.get("/api/jobs/a1", headers=bob).status_code == 403
            assert http.get("/api/jobs/a1/series", headers=bob).status_code == 403

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium,
                                        args=["--no-sandbox", "--headless"])
            try:
                context = browser.new_context(viewport={"width": 1280, "height": 900})
                page = context.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(url)
                expect(page.locator("#signin")).to_be_visible()
                assert page.locator("#queue-panel").count() == 0  # the form, not the page

                page.fill("#token", "not-a-token")
                page.click("#signin button[type=submit]")
                expect(page.locator("#signin-error")).to_contain_text("no user has this token")
                assert not [c for c in context.cookies() if c["name"] == "gpufleet_token"]

                page.fill("#token", tokens["alice"])
                page.click("#signin button[type=submit]")
                expect(page.locator("#queue-panel")).to_be_visible()
                expect(page.locator("#me-name")).to_contain_text("alice")
                waiting = page.locator('#queue tr[data-job="a2"]')
                expect(waiting.locator(".pos")).to_have_text("2")
                expect(waiting.locator(".est")).to_contain_text(re.compile(r"\d\d:\d\d:\d\d"))
                expect(waiting.locator(".est")).to_contain_text("in ")
                expect(waiting.locator(".why")).to_contain_text("behind the job at position 1")
                expect(page.locator('#running tr[data-job="a1"]')).to_be_visible()
                assert page.locator('#queue tr[data-job="b1"]').count() == 0  # bob's
                expect(page.locator("#jobs li.item")).to_have_count(1)  # a1, alice's own
                team = page.locator('#teams .team-card[data-team="ml"]')
                expect(team.locator('li[data-gpu="cpu"]')).to_contain_text("2 in use of 3")
                expect(team.locator(".budget")).to_contain_text("of $100.00 spent")
                expect(page.locator('#usage [data-window="month"] tr[data-user="alice"]')
                       ).to_be_visible()
                assert page.locator("#usage tr[data-user=bob]").count() == 0
                expect(page.locator('#usage [data-window="30d"] tr[data-team="ml"]')
                       ).to_be_visible()

                jar = {c["name"]: c for c in context.cookies()}
                cookie = jar["gpufleet_token"]
                assert cookie["value"] == tokens["alice"]
                assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
                assert page.evaluate("document.cookie") == ""  # out of the page's reach
                stored = page.evaluate("JSON.stringify([localStorage, sessionStorage])")
                assert tokens["alice"] not in stored
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "server-dashboard.png"))

                page.click('#running tr[data-job="a1"]')  # the job's own view, as before
                expect(page.locator("#j-name")).to_have_text("a1")
                expect(page.locator("#j-status")).to_have_text("running")
                page.click('#team-list li[data-kind="team"]')
                expect(page.locator("#queue-panel")).to_be_visible()

                page.click("#sign-out")
                expect(page.locator("#signin")).to_be_visible()
                assert not [c for c in context.cookies() if c["name"] == "gpufleet_token"]
                assert errors == []
            finally:
                browser.close()
    finally:
        gate.touch()
    done = wait_all_ended(admin, ["a1", "a2", "b1"], timeout=120)
    assert {done[n]["status"] for n in ("a1", "a2", "b1")} == {"succeeded"}, done

    usage = ok_json(admin, "usage")  # by user, the last 30 days
    teams = {t["team"]: t for t in ok_json(admin, "admin", "teams")}
    with httpx.Client(base_url=url, timeout=30) as http:
        m = samples(http.get("/metrics", headers={"Authorization": f"Bearer {admin_token}"}).text)
        mine = http.get("/api/v1/usage/summary",
                        headers={"Authorization": f"Bearer {tokens['alice']}"}).json()
    booked = {g["user"]: g["micro_usd"] for g in usage["groups"]}
    assert set(booked) == {"alice", "bob"} and all(v > 0 for v in booked.values()), usage
    assert micro_by_user(m, "gpufleet_usage_30d_usd") == booked
    first = min(done[n]["started_at"] for n in ("a1", "a2", "b1"))
    if time.gmtime(first).tm_mon == time.gmtime().tm_mon:  # not across a month's start
        assert micro_by_user(m, "gpufleet_usage_usd_total") == booked
    assert {lab["team"] for lab, _ in m["gpufleet_usage_30d_usd"]} == {"ml"}
    assert one(m, "gpufleet_team_spent_usd", team="ml") == teams["ml"]["spent_usd"]
    assert round(teams["ml"]["spent_usd"] * 1_000_000) == sum(booked.values())
    assert one(m, "gpufleet_queue_jobs", status="queued") == 0
    # the Usage panel's data as alice: her own usage, and her whole team's
    days = next(w for w in mine["windows"] if w["window"] == "30d")
    assert [(g["user"], g["micro_usd"]) for g in days["users"]["groups"]] == [
        ("alice", booked["alice"])]
    assert [(g["team"], g["micro_usd"]) for g in days["teams"]["groups"]] == [
        ("ml", sum(booked.values()))]
    assert [t["team"] for t in mine["teams"]] == ["ml"]
