"""reportauth: the report channel's signature. Only a datagram sealed with the job's key opens;
a tampered, foreign-key, bare or replayed one is refused with its reason, while one that merely
arrives out of order still opens."""

from __future__ import annotations

import importlib
import json
import socket
from collections.abc import Callable

import pytest

from gpufleet import reportauth
from gpufleet.reportauth import Rejection, Signer, Verifier, new_key, signer_from_env

KEY = new_key()
PAYLOAD = json.dumps({"t": 1.0, "rank": 0, "step": 3}).encode()


def test_a_sealed_datagram_opens_to_its_payload_and_never_carries_the_key() -> None:
    sealed = Signer(KEY).seal(PAYLOAD)
    assert Verifier(KEY).open(sealed) == PAYLOAD
    assert KEY.encode() not in sealed and bytes.fromhex(KEY) not in sealed
    assert len(KEY) == 64 and new_key() != KEY


def test_a_bare_or_truncated_datagram_is_unsigned() -> None:
    v = Verifier(KEY)
    assert v.open(PAYLOAD) is Rejection.UNSIGNED  # what the trial's forger sent
    assert v.open(b"") is Rejection.UNSIGNED
    assert v.open(Signer(KEY).seal(PAYLOAD).split(b"\n")[0]) is Rejection.UNSIGNED


def _flip_tag(datagram: bytes) -> bytes:
    head, _, payload = datagram.partition(b"\n")
    tag = head.split(b" ")[3]
    flipped = (b"1" if tag[:1] == b"0" else b"0") + tag[1:]
    return head[: -len(tag)] + flipped + b"\n" + payload


@pytest.mark.parametrize("tamper", [
    lambda d: d.replace(b'"step": 3', b'"step": 4'),  # the payload
    lambda d: d.replace(b" 1 ", b" 2 ", 1),  # the counter (a replay under a new number)
    _flip_tag,
    lambda d: d.replace(b"GF1 ", b"GF1 ff", 1),  # the sender
], ids=["payload", "counter", "tag", "sender"])
def test_a_tampered_datagram_has_a_bad_tag(tamper: Callable[[bytes], bytes]) -> None:
    sealed = Signer(KEY, sender="ab" * 8).seal(PAYLOAD)
    changed = tamper(sealed)
    assert changed != sealed
    assert Verifier(KEY).open(changed) is Rejection.BAD_TAG


def test_a_datagram_sealed_with_another_key_has_a_bad_tag() -> None:
    assert Verifier(KEY).open(Signer(new_key()).seal(PAYLOAD)) is Rejection.BAD_TAG


def test_a_replayed_datagram_is_refused_but_late_ones_within_the_window_open() -> None:
    signer, v = Signer(KEY), Verifier(KEY)
    first, second, third = (signer.seal(PAYLOAD) for _ in range(3))
    assert v.open(third) == PAYLOAD  # arrives first (another thread of the worker sent it)
    assert v.open(first) == PAYLOAD and v.open(second) == PAYLOAD
    for again in (first, second, third):
        assert v.open(again) is Rejection.REPLAYED
    for _ in range(reportauth.WINDOW + 5):
        last = signer.seal(PAYLOAD)
    assert v.open(last) == PAYLOAD
    assert v.open(signer.seal(PAYLOAD)) == PAYLOAD  # counters far ahead: still fine


def test_senders_are_told_apart_and_a_new_verifier_refuses_nothing_valid() -> None:
    a, b = Signer(KEY), Signer(KEY)
    assert a.sender != b.sender
    v = Verifier(KEY)
    assert v.open(a.seal(PAYLOAD)) == PAYLOAD and v.open(b.seal(PAYLOAD)) == PAYLOAD


def test_a_counter_too_old_for_the_window_is_refused() -> None:
    signer, v = Signer(KEY), Verifier(KEY)
    old = signer.seal(PAYLOAD)
    for _ in range(reportauth.WINDOW):
        new = signer.seal(PAYLOAD)
    assert v.open(new) == PAYLOAD
    assert v.open(old) is Rejection.REPLAYED  # cannot tell whether it was seen: refused


def test_the_signer_comes_from_the_environment_only_with_a_key() -> None:
    assert signer_from_env({}) is None
    assert signer_from_env({reportauth.KEY_ENV: "not hex"}) is None
    signer = signer_from_env({reportauth.KEY_ENV: KEY})
    assert signer is not None and Verifier(KEY).open(signer.seal(PAYLOAD)) == PAYLOAD


def test_a_worker_signs_its_reports_and_sends_nothing_without_a_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    report_module = importlib.import_module("gpufleet.train.report")

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink:
        sink.bind(("127.0.0.1", 0))
        sink.settimeout(2.0)
        monkeypatch.setenv("GPUFLEET_REPORT_ADDR", f"127.0.0.1:{sink.getsockname()[1]}")
        monkeypatch.delenv(reportauth.KEY_ENV, raising=False)
        monkeypatch.setattr(report_module, "_reporter", None)
        report_module.report(1, loss=2.0)
        monkeypatch.setenv(reportauth.KEY_ENV, KEY)
        monkeypatch.setattr(report_module, "_reporter", None)
        report_module.report(2, loss=1.5)
        report_module.send_event("checkpoint", step=2)
        v = Verifier(KEY)
        got = [json.loads(v.open(sink.recv(65536))) for _ in range(2)]  # type: ignore[arg-type]
        assert [r.get("step") for r in got] == [2, 2] and got[1]["event"] == "checkpoint"
        sink.settimeout(0.2)
        with pytest.raises(TimeoutError):
            sink.recv(65536)  # the unkeyed report was never sent
    monkeypatch.setattr(report_module, "_reporter", None)
