"""The dashboard's charts as someone used to W&B reads them, in a real browser (Debian's
chromium, driven by Playwright), on a real finished job whose script never calls `prepare` and
reports a learning rate and a gradient norm of its own through `train.report(step, **extra)`:
a step or time axis that is remembered, a chart per reported metric, the raw loss shown with a
labelled, adjustable smoothing, one throughput figure, and no empty panels once the job ended.
Its first run fails and the restart counts from step 1 again: each run is a series of its own,
every chart marks the restart, the header counts it, and the communication charts say they are
not measured for this script, and why.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from fleet_helpers import WORKERS, Fleet
from test_dashboard_browser import _chromium, _url

if TYPE_CHECKING:
    from playwright.sync_api import Page

STEPS = 30
FAIL_AT = 8  # the first run's last rank exits 1 after this step


def _x_axis(page: Page, chart: str) -> tuple[str, list[str]]:
    """The x axis's name and tick labels of one chart."""
    svg = f'svg[data-chart="{chart}"]'
    return (page.eval_on_selector(f"{svg} text.xu", "e => e.textContent"),
            page.eval_on_selector_all(f"{svg} text.tick.x", "els => els.map(e => e.textContent)"))


def _paths(page: Page, chart: str, attr: str = "points") -> list[int]:
    return page.eval_on_selector_all(f'svg[data-chart="{chart}"] path[data-{attr}]',
                                     f"els => els.map(e => Number(e.dataset.{attr}))")


def _markers(page: Page, chart: str) -> list[str]:
    """The labels of the markers one chart draws."""
    return page.eval_on_selector_all(f'svg[data-chart="{chart}"] g.marker text',
                                     "els => els.map(e => e.textContent)")


def _per_run(detail: dict[str, Any], points: list[list[float]]) -> list[int]:
    """How many of a series' points fall in each run of the job (by the runs' start times)."""
    starts = [r["start"] for r in detail["runs"]]
    counts = [0] * len(starts)
    for t, *_ in points:
        counts[max([0] + [i for i, s in enumerate(starts) if t >= s])] += 1
    return counts


def _runs(page: Page, chart: str) -> list[int]:
    return page.eval_on_selector_all(f'svg[data-chart="{chart}"] path[data-points]',
                                     "els => els.map(e => Number(e.dataset.run))")


def _smoothing(page: Page, value: float) -> None:
    page.eval_on_selector("#smoothing", "(el, v) => { el.value = String(v); "
                          "el.dispatchEvent(new Event('input', {bubbles: true})); }", value)


def _close(text: str, value: float) -> bool:
    """A figure the page shows (4 significant decimals at most) is the reported value."""
    return abs(float(text.replace(",", "")) - value) <= 5e-5 * max(1.0, abs(value))


def _ema(values: list[float], weight: float) -> float:
    """The last value of a start-debiased EMA (how TensorBoard and W&B smooth)."""
    last = 0.0
    for v in values:
        last = last * weight + (1 - weight) * v
    return last / (1 - weight ** len(values))


def test_dashboard_charts_by_step_custom_metrics_raw_loss(fleet: Fleet, tmp_path: Path) -> None:
    chromium = _chromium()
    from playwright.sync_api import expect, sync_playwright

    out = tmp_path / "reported.json"
    r = fleet("run", str(WORKERS / "report_extras.py"), "--gpu", "cpu", "--count", "2",
              "--name", "extras", "--max-restarts", "1", "-y", "--", "--steps", str(STEPS),
              "--out", str(out), "--fail-at", str(FAIL_AT), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    reported: list[dict[str, Any]] = json.loads(out.read_text())  # by the second run
    assert len(reported) == STEPS
    dash = fleet.popen("dashboard", "extras", "--port", "0")
    try:
        url = _url(dash)
        # what the page reads: two runs, the restart between them at rank 0's step by then,
        # the restart counted, the communication charts not measured for this script
        detail = httpx.get(f"{url.rstrip('/')}/api/jobs/extras", timeout=10).json()
        assert [(r["number"], r["cause"]) for r in detail["runs"]] == [(1, "start"), (2, "restart")]
        assert detail["restarts"] == 1
        [mark] = detail["markers"]
        assert (mark["kind"], mark["label"]) == ("restarting", "restart")
        assert 1 <= mark["step"] <= FAIL_AT
        assert set(detail["not_measured"]) == {"comm_seconds", "comm_bandwidth_bytes_per_second"}
        lr = httpx.get(f"{url.rstrip('/')}/api/jobs/extras/series", params={"names": "lr"},
                       timeout=10).json()["series"]["lr"]["rank 0"]
        runs = _per_run(detail, lr)  # rank 0's reports in each run
        assert runs[0] >= 1 and runs[1] == STEPS, runs
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--headless"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 1600})
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(url)
                expect(page.locator("#j-status")).to_have_text("succeeded")
                page.wait_for_selector('svg[data-chart="lr"] path[data-points]', timeout=20_000)

                # a chart for each metric the script reported, none for `samples=`
                expect(page.locator("#custom-names")).to_have_text("grad_norm, lr")
                assert _paths(page, "lr") == runs, "rank 0's lr, a series per run"
                assert _runs(page, "lr") == [1, 2]
                assert _close(page.inner_text("#card-lr .now"), reported[-1]["lr"])
                assert _close(page.inner_text("#card-grad_norm .now"), reported[-1]["grad_norm"])

                # the raw loss is drawn and is the number shown, in the card and the header;
                # each run's own line, and its own smoothing (the EMA starts again)
                assert _paths(page, "loss") == runs
                card_loss = page.inner_text("#loss")
                assert page.inner_text("#card-loss .now") == card_loss
                assert _close(card_loss, reported[-1]["loss"])
                expect(page.locator("#card-loss .note")).to_have_text("smoothed, EMA 0.6")
                assert _paths(page, "loss", "smoothed") == runs
                keys = page.locator("#card-loss .legend .key")
                legend = dict(zip(keys.evaluate_all("els => els.map(e => e.dataset.name)"),
                                  keys.locator("b").all_inner_texts(), strict=True))
                assert set(legend) == {f"{line}, run {n}" for n in (1, 2)
                                       for line in ("raw, rank 0", "smoothed, EMA 0.6")}, legend
                assert legend["raw, rank 0, run 2"] == card_loss
                assert _close(legend["smoothed, EMA 0.6, run 2"],
                              _ema([r["loss"] for r in reported], 0.6)), legend
                _smoothing(page, 0.9)
                expect(page.locator("#card-loss .note")).to_have_text("smoothed, EMA 0.9")
                _smoothing(page, 0)
                expect(page.locator("#card-loss .note")).to_have_text("smoothing off")
                assert _paths(page, "loss", "smoothed") == []
                assert _paths(page, "loss") == runs, "the raw loss stays"

                # the restart: a marker on every chart drawn, counted in the header
                expect(page.locator("#j-restarts")).to_have_text("1 restart")
                drawn = page.eval_on_selector_all("svg[data-chart]:has(path[data-points])",
                                                  "els => els.map(e => e.dataset.chart)")
                assert {"loss", "lr", "grad_norm", "gpu_utilization"} <= set(drawn), drawn
                for chart in drawn:
                    assert _markers(page, chart) == ["restart"], chart

                # one throughput figure
                tput = page.inner_text("#samples-per-s")
                assert re.fullmatch(r"[\d,]+", tput), tput
                assert page.inner_text("#card-job_samples_per_second .now") == tput

                # by step (the default), then by time, remembered across a reload
                name, ticks = _x_axis(page, "lr")
                assert name == "step"
                assert ticks and all(t.isdigit() and 0 <= int(t) <= STEPS for t in ticks), ticks
                page.click('#chart-tools [data-axis="time"]')
                for chart in ("lr", "loss", "gpu_utilization", "step_time_seconds"):
                    name, ticks = _x_axis(page, chart)
                    assert name.startswith("time since start"), (chart, name)
                    assert ticks and all(re.fullmatch(r"\d+:\d\d", t) for t in ticks), ticks
                    assert _markers(page, chart) == ["restart"], chart
                page.reload()
                page.wait_for_selector('svg[data-chart="lr"] path[data-points]', timeout=20_000)
                assert _x_axis(page, "loss")[0].startswith("time since start")
                expect(page.locator("#card-loss .note")).to_have_text("smoothing off")
                assert _paths(page, "lr") == runs
                page.click('#chart-tools [data-axis="step"]')
                assert _x_axis(page, "gpu_utilization")[0] == "step"

                # ended, without prepare: the communication panels say they are not measured
                # for this script, and why; no other chart is an empty placeholder
                for chart in ("comm_seconds", "comm_bandwidth_bytes_per_second"):
                    card = page.locator(f"#card-{chart}")
                    expect(card.locator("text.nodata")).to_have_text("not measured for this script")
                    expect(card.locator(".why")).to_contain_text("gpufleet.train.prepare")
                assert page.locator("text.nodata").count() == 2
                assert page.get_by_text(re.compile("no data yet|waiting for")).count() == 0
                assert errors == []
            finally:
                browser.close()
    finally:
        dash.terminate()
        try:
            dash.wait(10)
        except subprocess.TimeoutExpired:
            dash.kill()
            dash.wait()
