"""PostgreSQL store URLs as a user writes them: the driver named for SQLAlchemy, the password
kept out of messages. (The store itself on a server: tests/integration/test_store_backends.py.)"""

from __future__ import annotations

import pytest

from gpufleet.errors import StateError
from gpufleet.store import Store
from gpufleet.store import postgres as pg


@pytest.mark.parametrize("url", ["postgresql://u:p@db.example:5432/fleet",
                                 "postgres://u:p@db.example:5432/fleet"])
def test_a_users_url_gets_the_psycopg_driver(url: str) -> None:
    assert pg.is_postgres(url)
    assert pg.engine_url(url) == "postgresql+psycopg://u:p@db.example:5432/fleet"


def test_urls_that_name_a_driver_or_another_database_are_left_alone() -> None:
    assert pg.engine_url("postgresql+psycopg://u@h/d") == "postgresql+psycopg://u@h/d"
    assert pg.is_postgres("postgresql+psycopg://u@h/d")
    assert pg.engine_url("sqlite:////tmp/s.db") == "sqlite:////tmp/s.db"
    assert not pg.is_postgres("sqlite:////tmp/s.db")


def test_a_shown_url_has_no_password_anywhere() -> None:
    shown = pg.shown("postgres://ada:hunter2@db.example:5433/fleet?password=x2&sslmode=require")
    assert shown == "postgresql://ada@db.example:5433/fleet?sslmode=require"


def test_a_connect_timeout_unless_the_url_sets_one() -> None:
    assert pg.connect_args("postgresql://u@h/d") == {"connect_timeout": pg.CONNECT_TIMEOUT_S}
    assert pg.connect_args("postgresql://u@h/d?connect_timeout=3") == {}


def test_an_unreadable_url_is_one_line() -> None:
    with pytest.raises(StateError, match="the database URL cannot be read"):
        Store("postgresql://u@h:port/d")
