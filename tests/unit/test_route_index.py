"""`GET /api`'s index is read from the app itself: every route the dashboard and the team server
answer is in it, once per method, each with a line on what it does."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.routing import APIRoute

from gpufleet.server.api import create_api
from gpufleet.server.routes import DESCRIBED
from gpufleet.store import Store
from gpufleet.web.app import create_app
from gpufleet.web.routes import index


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    return Store(url=f"sqlite:///{tmp_path}/s.db")


def _served(app: object) -> set[tuple[str, str]]:
    return {(m, r.path) for r in app.routes if isinstance(r, APIRoute)  # type: ignore[attr-defined]
            for m in (r.methods or set()) - {"HEAD"}}


@pytest.mark.parametrize("which", ["dashboard", "team server"])
def test_every_route_is_listed_once_with_a_description(store: Store, which: str) -> None:
    app = create_app(store) if which == "dashboard" else create_api(store)
    listed = index(app, DESCRIBED if which == "team server" else None)
    pairs = [(r["method"], r["path"]) for r in listed]
    assert len(pairs) == len(set(pairs))
    assert set(pairs) == (_served(app) - {("GET", "/api/")}) | {("GET", "/static/{file}")}
    assert [r for r in listed if not r["description"]] == []
    assert pairs == sorted(pairs, key=lambda p: (p[1], p[0]))
    assert {("GET", "/api"), ("GET", "/api/jobs"), ("GET", "/metrics")} <= set(pairs)


def test_the_server_table_names_only_routes_that_exist(store: Store) -> None:
    assert set(DESCRIBED) <= _served(create_api(store))


def test_every_declared_path_is_served_and_every_v1_route_is_declared(store: Store) -> None:
    """`server/paths.py` is the one place an /api/v1 path is written: the CLI's client calls
    only paths the server answers, and the server answers none that is not declared there."""
    from gpufleet.server import paths

    declared = {v for k, v in vars(paths).items() if k.isupper() and k != "V1"}
    served = {path for _m, path in _served(create_api(store))}
    assert declared == {p for p in served if p.startswith(paths.V1 + "/")}


def test_a_name_fills_its_path_as_one_segment() -> None:
    from gpufleet.server import paths

    assert paths.at(paths.JOB_LOGS, "a b/c") == "/api/v1/jobs/a%20b%2Fc/logs"
    assert paths.at(paths.USER, "bob") == "/api/v1/admin/users/bob"
