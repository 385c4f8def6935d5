"""The dashboard page in a real browser (Debian's chromium, driven by Playwright) following a live
job: its charts grow without a reload, cost and ETA update, and the diagnosis appears.

Auth is tested separately, against the API; here the dashboard is on loopback, which needs none.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from fleet_helpers import WORKERS, Fleet

if TYPE_CHECKING:
    from playwright.sync_api import Page


ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


def _chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        reason = "the dashboard browser test needs Debian's chromium (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return found


def _url(dash: subprocess.Popen[str], timeout: float = 30.0) -> str:
    """The address from the dashboard's first stderr line."""
    assert dash.stderr is not None
    ready, _, _ = select.select([dash.stderr], [], [], timeout)
    line = dash.stderr.readline() if ready else ""
    found = re.search(r"http://\S+", line)
    if found is None:
        dash.kill()
        pytest.fail(f"dashboard did not print its address in {timeout}s: {line!r} "
                    f"{dash.communicate()[1]!r}")
    return found.group(0)


def _dollars(text: str) -> float:
    found = re.search(r"\$([\d,]+\.\d+)", text)
    assert found, f"no dollar figure in {text!r}"
    return float(found.group(1).replace(",", ""))


def _points(page: Page, chart: str) -> list[int]:
    """Points held by each line of one chart (from the data-points each path carries)."""
    return page.eval_on_selector_all(f'svg[data-chart="{chart}"] path[data-points]',
                                     "els => els.map(e => Number(e.dataset.points))")


def test_dashboard_follows_a_live_job(fleet: Fleet, tmp_path: Path) -> None:
    chromium = _chromium()
    from playwright.sync_api import expect, sync_playwright

    # ~16 steps/s at most with a 50 ms batch: 20,000 steps (17 minutes at least) outlast any
    # test however loaded the machine (800 left a browser slowed down by load racing the
    # job's end); we stop it at the end
    r = fleet("run", str(WORKERS / "telemetry_job.py"), "--gpu", "cpu", "--count", "2",
              "--name", "web", "--detach", "-y", "--", "--steps", "20000", "--data-delay",
              "0.05")
    assert r.returncode == 0, r.stdout + r.stderr
    dash = fleet.popen("dashboard", "web", "--port", "0")
    try:
        url = _url(dash)
        fleet.wait_for_step("web", 20)  # past its first reports: throughput and ETA are known
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--headless"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(url)
                expect(page.locator("#j-name")).to_have_text("web")
                page.wait_for_selector('svg[data-chart="job_samples_per_second"] path[data-points]',
                                       timeout=20_000)

                before = _points(page, "job_samples_per_second")
                cost_before = _dollars(page.inner_text("#cost"))
                page.wait_for_timeout(3000)
                after = _points(page, "job_samples_per_second")
                assert len(before) == len(after) == 1
                assert after[0] > before[0], "the throughput chart did not grow without a reload"
                assert _dollars(page.inner_text("#cost")) > cost_before
                assert _dollars(page.inner_text("#projected-cost")) > 0
                expect(page.locator("#eta")).to_have_text(re.compile(r"^\d+[smhd]"))
                expect(page.locator("#step")).to_contain_text("/ 20,000")

                finding = page.locator('[data-rule="data_loading"]')
                finding.wait_for(timeout=40_000)
                expect(finding).to_contain_text("Try:")
                assert len(_points(page, "gpu_utilization")) == 2, "one line per device"
                assert len(_points(page, "step_time_seconds")) == 4, "step and data wait, 2 ranks"
                assert errors == []

                height = page.evaluate("document.querySelector('main').scrollHeight")
                page.set_viewport_size({"width": 1280, "height": min(3000, height)})  # all of it
                page.wait_for_timeout(1500)  # the next poll redraws the charts
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(tmp_path / "dashboard.png"))
                page.screenshot(path=str(ARTIFACTS / "dashboard.png"))
            finally:
                browser.close()
    finally:
        fleet("stop", "web")
        dash.terminate()
        try:
            dash.wait(10)
        except subprocess.TimeoutExpired:
            dash.kill()
            dash.wait()
