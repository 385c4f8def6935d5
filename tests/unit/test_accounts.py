"""Users, tokens, quotas, budgets and the audit trail on a real SQLite store: what an admin may
change, what everyone else is refused, and what is kept (a token's hash, never the token)."""

from __future__ import annotations

import calendar
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from gpufleet.errors import ConflictError, ForbiddenError, NotFoundError, SpecError
from gpufleet.lifecycle import accounts, teams
from gpufleet.lifecycle.accounts import Identity
from gpufleet.store import Budget, Quota, Store, Team, User

ADMIN = Identity("root", None, True)
NOW = float(calendar.timegm((2030, 6, 15, 12, 0, 0)))  # June 2030


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path / "home"))
    s = Store(url=f"sqlite:///{tmp_path}/s.db")
    yield s
    s.close()


def fields(exc: pytest.ExceptionInfo[SpecError]) -> list[str]:
    return [f for f, _ in exc.value.problems]


def test_a_user_gets_a_token_kept_only_as_its_sha256(store: Store, tmp_path: Path) -> None:
    token = accounts.add_user(store, ADMIN, "ana", "vision", admin=False)
    assert len(token) >= 32
    with store.read() as s:
        row = s.scalar(select(User).where(User.name == "ana"))
        teams_made = list(s.scalars(select(Team.name)))
    assert row is not None
    assert row.token_sha256 == hashlib.sha256(token.encode()).hexdigest() != token
    kept = b"".join(p.read_bytes() for p in tmp_path.glob("s.db*"))  # with the WAL
    assert token.encode() not in kept and row.token_sha256.encode() in kept
    assert teams_made == ["vision"]  # the team is made with its first user
    assert accounts.from_token(store, token) == Identity("ana", "vision", False)
    assert accounts.from_token(store, token + "x") is None
    assert accounts.from_token(store, "") is None
    assert accounts.from_token(store, None) is None
    other = accounts.add_user(store, ADMIN, "bo", None, admin=True)
    assert other != token
    assert accounts.from_token(store, other) == Identity("bo", None, True)
    assert [u["name"] for u in accounts.users(store)] == ["ana", "bo"]


def test_a_second_user_of_one_name_is_refused(store: Store) -> None:
    accounts.add_user(store, ADMIN, "ana", None, admin=False)
    with pytest.raises(ConflictError, match="already exists"):
        accounts.add_user(store, ADMIN, "ana", "vision", admin=False)
    with store.read() as s:  # the refused call made no team either
        assert list(s.scalars(select(Team.name))) == []


def test_only_an_admin_changes_users_quotas_and_budgets(store: Store) -> None:
    accounts.add_user(store, ADMIN, "ana", "vision", admin=False)
    ana = Identity("ana", "vision", False)
    calls = [lambda: accounts.add_user(store, ana, "eve", None, admin=True),
             lambda: accounts.remove_user(store, ana, "ana"),
             lambda: accounts.set_quota(store, ana, "vision", "A100", 8),
             lambda: accounts.set_budget(store, ana, "vision", 100.0, None, NOW)]
    for call in calls:
        with pytest.raises(ForbiddenError, match="only an admin"):
            call()
    with store.read() as s:
        assert [u.name for u in s.scalars(select(User))] == ["ana"]
        assert list(s.scalars(select(Quota))) == [] and list(s.scalars(select(Budget))) == []
    assert [e["action"] for e in accounts.audit_log(store)] == ["user_add"]


def test_bad_values_are_spec_errors_naming_their_field(store: Store) -> None:
    accounts.add_user(store, ADMIN, "ana", "vision", admin=False)
    cases = [
        (lambda: accounts.add_user(store, ADMIN, "Bad Name", None, admin=False), "user"),
        (lambda: accounts.add_user(store, ADMIN, "bo", "Team!", admin=False), "team"),
        (lambda: accounts.set_quota(store, ADMIN, "vision", "A100", -1), "devices"),
        (lambda: accounts.set_quota(store, ADMIN, "vision", "no-such-gpu", 2), "gpu"),
        (lambda: accounts.set_budget(store, ADMIN, "vision", -5.0, None, NOW), "usd"),
        (lambda: accounts.set_budget(store, ADMIN, "vision", float("nan"), None, NOW), "usd"),
        (lambda: accounts.set_budget(store, ADMIN, "vision", 5.0, "2030-05", NOW), "month"),
        (lambda: accounts.set_budget(store, ADMIN, "vision", 5.0, "2030-13", NOW), "month"),
        (lambda: accounts.set_budget(store, ADMIN, "vision", 5.0, "june", NOW), "month"),
        (lambda: accounts.set_budget(store, ADMIN, "vision", 5.0, "2030-6", NOW), "month"),
    ]
    for call, field in cases:
        with pytest.raises(SpecError) as exc:
            call()
        assert fields(exc) == [field], field
    with pytest.raises(SpecError, match=r"in the past.*2030-06"):
        accounts.check_month("2030-05", NOW)
    assert accounts.check_month("2030-06", NOW) == "2030-06"
    assert accounts.check_month("2031-01", NOW) == "2031-01"


def test_a_quota_or_budget_for_an_unknown_team_is_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError, match="no team named 'nlp'"):
        accounts.set_quota(store, ADMIN, "nlp", "A100", 2)
    with pytest.raises(NotFoundError, match="no team named 'nlp'"):
        accounts.set_budget(store, ADMIN, "nlp", 10.0, None, NOW)
    with pytest.raises(NotFoundError):
        accounts.remove_user(store, ADMIN, "nobody")


def test_quotas_are_set_changed_and_removed(store: Store) -> None:
    accounts.add_user(store, ADMIN, "ana", "vision", admin=False)
    accounts.set_quota(store, ADMIN, "vision", "a100", 4)  # kept as a cluster spec names it
    with store.read() as s:
        assert accounts.quotas(s) == {("vision", "A100-80GB"): 4}
    accounts.set_quota(store, ADMIN, "vision", "A100-80GB", 2)
    accounts.set_quota(store, ADMIN, "vision", "cpu", 0)
    with store.read() as s:
        assert accounts.quotas(s) == {("vision", "A100-80GB"): 2, ("vision", "cpu"): 0}
    accounts.set_quota(store, ADMIN, "vision", "A100", None)
    accounts.set_quota(store, ADMIN, "vision", "H200", None)  # none to remove: fine
    with store.read() as s:
        assert accounts.quotas(s) == {("vision", "cpu"): 0}


def test_a_months_own_budget_wins_over_every_month_and_none_removes(store: Store) -> None:
    accounts.add_user(store, ADMIN, "ana", "vision", admin=False)
    accounts.add_user(store, ADMIN, "bo", "nlp", admin=False)
    accounts.set_budget(store, ADMIN, "vision", 100.0, None, NOW)
    accounts.set_budget(store, ADMIN, "vision", 40.0, "2030-07", NOW)
    accounts.set_budget(store, ADMIN, "nlp", 7.5, "2030-06", NOW)
    with store.read() as s:
        assert accounts.budgets_for(s, "2030-06") == {"vision": 100.0, "nlp": 7.5}
        assert accounts.budgets_for(s, "2030-07") == {"vision": 40.0}
        assert accounts.budgets_for(s, "2030-08") == {"vision": 100.0}
    accounts.set_budget(store, ADMIN, "vision", 60.0, None, NOW)  # changed in place
    accounts.set_budget(store, ADMIN, "vision", None, "2030-07", NOW)
    with store.read() as s:
        assert accounts.budgets_for(s, "2030-07") == {"vision": 60.0}
        assert len(list(s.scalars(select(Budget).where(Budget.team == "vision")))) == 1
    view = teams.team_view(store, "vision", NOW)
    assert (view["budget_usd"], view["spent_usd"], view["left_usd"]) == (60.0, 0.0, 60.0)
    assert view["users"] == ["ana"] and view["month"] == "2030-06"


def test_every_change_is_audited_with_who_what_and_whom(store: Store) -> None:
    accounts.add_user(store, ADMIN, "ana", "vision", admin=True)
    ana = Identity("ana", "vision", True)
    accounts.set_quota(store, ana, "vision", "A100", 3)
    accounts.set_budget(store, ADMIN, "vision", 12.5, "2030-06", NOW)
    accounts.remove_user(store, ana, "ana")
    got = [(e["user"], e["action"], e["subject"], e["detail"])
           for e in reversed(accounts.audit_log(store))]
    assert got == [("root", "user_add", "ana", "team vision, admin"),
                   ("ana", "quota_set", "vision", "A100-80GB: 3"),
                   ("root", "budget_set", "vision", "2030-06: 12.5"),
                   ("ana", "user_remove", "ana", "")]
    assert [e["action"] for e in accounts.audit_log(store, user="ana")] == ["user_remove",
                                                                            "quota_set"]
    assert len(accounts.audit_log(store, limit=2)) == 2
    with store.session() as s:
        accounts.audit(s, "gpufleet", "start", "j", "", t=5.0)
    assert accounts.audit_log(store)[0]["action"] == "start"
    assert "start" not in [e["action"] for e in accounts.audit_log(store, since=10.0)]


def test_users_act_on_their_own_and_admins_on_everyones() -> None:
    ana, bo = Identity("ana", "vision", False), Identity("bo", "vision", False)
    accounts.may_act_on(ana, "ana", "stop j")
    accounts.may_act_on(ADMIN, "ana", "stop j")
    accounts.may_act_on(ADMIN, None, "stop j")
    with pytest.raises(ForbiddenError, match="stop j: it is not yours \\(bo\\)"):
        accounts.may_act_on(bo, "ana", "stop j")  # the same team is not enough
    with pytest.raises(ForbiddenError, match="it is not yours"):
        accounts.may_act_on(bo, None, "stop j")


def test_the_local_identity_is_an_admin_with_its_user_rows_team(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accounts, "os_user", lambda: "cy")  # whoever runs the tests
    assert accounts.local_identity(store) == Identity("cy", None, True)
    accounts.add_user(store, ADMIN, "cy", "vision", admin=False)
    assert accounts.local_identity(store) == Identity("cy", "vision", True)  # admin still
