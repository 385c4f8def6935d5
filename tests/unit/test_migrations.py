"""Alembic migrations of the store: a new store is made from the models and stamped; a state
file of the version before Alembic is upgraded to exactly the models' tables and columns; a
store at the newest revision is left alone (no Alembic import on that path)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, inspect, text

from gpufleet.store import Store, migrations
from gpufleet.store.models import Base

DUMP = Path(__file__).parent / "data" / "state-before-queue.sql"


def _shape(url: str) -> dict[str, set[str]]:
    engine = create_engine(url)
    try:
        i = inspect(engine)
        return {t: {c["name"] for c in i.get_columns(t)} for t in i.get_table_names()
                if t != migrations.TABLE}
    finally:
        engine.dispose()


def _models() -> dict[str, set[str]]:
    return {t.name: {c.name for c in t.columns} for t in Base.metadata.sorted_tables}


def _revision(url: str) -> str | None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        engine.dispose()


def test_a_new_store_is_the_models_stamped_with_the_newest_revision(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    Store(url).close()
    assert _shape(url) == _models()
    assert _revision(url) == migrations.HEAD


def test_the_version_before_alembic_upgrades_to_exactly_the_models(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.executescript(DUMP.read_text())
        db.execute("PRAGMA user_version = 2")
    db.close()
    url = f"sqlite:///{path}"
    old = _shape(url)
    assert "queue" not in old and "user" not in old["jobs"]
    Store(url).close()
    assert _shape(url) == _models()
    assert _revision(url) == migrations.HEAD
    with sqlite3.connect(path) as db:  # its rows survived
        assert db.execute("SELECT name, status FROM jobs").fetchall() == [("old-job", "succeeded")]
        unique = {r[1] for r in db.execute("PRAGMA index_list('users')") if r[2]}
    db.close()
    assert unique, "users.name and users.token_sha256 are unique"


def test_every_revision_file_is_in_the_chain_to_head() -> None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    scripts = ScriptDirectory.from_config(cfg)
    assert scripts.get_heads() == [migrations.HEAD]
    chain = [r.revision for r in scripts.walk_revisions()]
    assert chain[-1] == migrations.BASELINE and chain[0] == migrations.HEAD
    files = sorted(p.name for p in (Path(migrations.__file__).parent / "versions").glob("0*.py"))
    assert len(files) == len(chain), files


def test_a_current_store_opens_without_importing_alembic(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    Store(url).close()
    probe = ("import sys; from gpufleet.store import Store; Store(sys.argv[1]).close(); "
             "print('alembic' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", probe, url], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
