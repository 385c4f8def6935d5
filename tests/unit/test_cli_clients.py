"""Which client a command gets, and the refusals each place gives before any state or network
is touched (the rows both give are compared in tests/integration/test_cli_parity.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.cli.client_local import LocalClient
from gpufleet.cli.client_server import ServerClient
from gpufleet.cli.connect import client
from gpufleet.errors import SpecError
from gpufleet.server.client import Client

NOWHERE = "http://127.0.0.1:9"  # never called: each refusal comes first


def _fields(exc: pytest.ExceptionInfo[SpecError]) -> str:
    return str(exc.value)


def test_the_logged_in_server_else_this_machine(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path))
    monkeypatch.delenv("GPUFLEET_SERVER", raising=False)
    monkeypatch.delenv("GPUFLEET_TOKEN", raising=False)
    assert isinstance(client(), LocalClient)
    monkeypatch.setenv("GPUFLEET_SERVER", NOWHERE + "/")
    got = client()
    assert isinstance(got, ServerClient) and got.url == NOWHERE


def test_through_a_server_what_only_this_machine_can_do_is_refused_by_name() -> None:
    s = ServerClient(Client(NOWHERE, "t"))
    with pytest.raises(SpecError, match="bench allreduce measures a cluster of this machine") \
            as e:
        s.refuse_here_only("bench allreduce")
    assert _fields(e).startswith("cluster:") and NOWHERE in _fields(e)
    with pytest.raises(SpecError, match=r"^resume: --resume works on this machine's own state"):
        s.resume("j", True, None, True)
    with pytest.raises(SpecError, match=r"^all: with a server, stop jobs by name"):
        s.stop(None, True, True)


def test_here_a_bad_grouping_or_duration_names_its_field(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_HOME", str(tmp_path))
    here = LocalClient()
    here.refuse_here_only("bench allreduce")  # this machine measures its own clusters
    with pytest.raises(SpecError, match=r"^by: 'week' is not a grouping; allowed: user, "):
        here.usage("week", "30d")
    with pytest.raises(SpecError, match=r"^since:"):
        here.audit("soon", None)
    assert not (tmp_path / "state.db").exists()  # refused before the store was opened
