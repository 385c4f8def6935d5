"""Signing the report channel: only the job's own workers and node agents can talk to its
supervisor.

The report socket is UDP on a port any local process can reach, and what arrives there moves a
job (progress, sign of life for the hang check, the pid telemetry samples, checkpoint notes, the
exit for a resize). So the supervisor makes a random key per job run (`new_key`) and hands it to
the processes it starts through their environment ($GPUFLEET_REPORT_KEY); every datagram then
carries an HMAC-SHA256 tag over its payload, never the key itself:

    GF1 <sender id> <counter> <tag, 64 hex digits>\\n<payload (JSON)>

The tag covers the header's sender id and counter as well as the payload, so a captured datagram
cannot be re-sent under a new counter. A sender id is random per sending process (pids repeat
across the nodes of a Ray pool); its counter only grows, and `Verifier` remembers, per sender, the
highest counter and which of the `WINDOW` below it it has seen: a replay is refused, while a
datagram that arrives out of order (two threads of one worker send) still counts. No clock is
compared: Ray nodes' clocks differ, and the key is new for every supervisor, so a datagram
captured from an earlier one fails its tag.

Stdlib only and pure (the randomness is passed in or drawn once per process): workers import it
through `gpufleet.train.report`.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import os
import secrets
import threading
from collections import OrderedDict
from collections.abc import Mapping
from enum import StrEnum

KEY_ENV = "GPUFLEET_REPORT_KEY"
MAGIC = b"GF1"
WINDOW = 256  # counters below a sender's highest that may still arrive late
MAX_SENDERS = 4096  # senders remembered per job (ranks x runs + node agents), oldest forgotten
_TAG_HEX = 64


class Rejection(StrEnum):
    """Why a datagram was dropped."""

    UNSIGNED = "unsigned"  # no header at all (or not one of ours)
    BAD_TAG = "bad_tag"  # a header whose tag does not match: forged, tampered, other key
    REPLAYED = "replayed"  # a valid datagram seen before


def new_key() -> str:
    """A fresh key (32 random bytes, hex), made by the supervisor for one job run."""
    return secrets.token_hex(32)


def _keyed(key: str) -> hmac.HMAC:
    """An HMAC with the key's pads hashed once: each tag copies it (half the cost of a fresh
    one, and `report()` is on the training loop's path)."""
    return hmac.new(bytes.fromhex(key), digestmod=hashlib.sha256)


def _tag(keyed: hmac.HMAC, header: bytes, payload: bytes) -> bytes:
    mac = keyed.copy()
    mac.update(header + b"\n" + payload)
    return mac.hexdigest().encode()


class Signer:
    """Seals one process's datagrams. Thread-safe: the counter is taken under a lock."""

    def __init__(self, key: str, sender: str | None = None):
        self._keyed = _keyed(key)
        self.sender = sender or os.urandom(8).hex()
        self._count = itertools.count(1)
        self._lock = threading.Lock()

    def seal(self, payload: bytes) -> bytes:
        with self._lock:
            n = next(self._count)
        header = b"%s %s %d" % (MAGIC, self.sender.encode(), n)
        return header + b" " + _tag(self._keyed, header, payload) + b"\n" + payload


def signer_from_env(environ: Mapping[str, str]) -> Signer | None:
    """The signer for a process the supervisor started; None outside a job (or a bad key: a
    datagram it could not sign would be dropped anyway)."""
    key = environ.get(KEY_ENV, "")
    try:
        return Signer(key) if key else None
    except ValueError:
        return None


class _Seen:
    """One sender's counters: the highest, and a bit per counter in the window below it."""

    __slots__ = ("bits", "top")

    def __init__(self) -> None:
        self.top = 0
        self.bits = 0  # bit i: counter top - i was seen

    def admit(self, n: int) -> bool:
        if n > self.top:
            shift = n - self.top
            self.bits = ((self.bits << shift) | 1) & ((1 << WINDOW) - 1)
            self.top = n
            return True
        back = self.top - n
        if back >= WINDOW or self.bits >> back & 1:
            return False  # too old to tell, or seen
        self.bits |= 1 << back
        return True


class Verifier:
    """Opens datagrams sealed with the job's key; the payload, or why it was dropped."""

    def __init__(self, key: str):
        self._keyed = _keyed(key)
        self._senders: OrderedDict[bytes, _Seen] = OrderedDict()

    def open(self, datagram: bytes) -> bytes | Rejection:
        head, newline, payload = datagram.partition(b"\n")
        parts = head.split(b" ")
        if not newline or len(parts) != 4 or parts[0] != MAGIC:
            return Rejection.UNSIGNED
        _, sender, counter, tag = parts
        if len(tag) != _TAG_HEX or not counter.isdigit() or len(counter) > 19:
            return Rejection.BAD_TAG
        header = head[: -len(tag) - 1]
        if not hmac.compare_digest(_tag(self._keyed, header, payload), tag):
            return Rejection.BAD_TAG
        seen = self._senders.get(sender)
        if seen is None:
            seen = self._senders[sender] = _Seen()
            if len(self._senders) > MAX_SENDERS:
                self._senders.popitem(last=False)
        self._senders.move_to_end(sender)
        return payload if seen.admit(int(counter)) else Rejection.REPLAYED
