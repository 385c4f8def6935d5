"""What a module adding routes to the API is handed (`Ctx`), and the refusal of a call without a
usable token (`NoToken`). A leaf below `api.py` and its route modules (`api_admin`,
`api_clusters`, `pages`): they import it, not `api.py`, so the app and its routes form no import
circle, `TYPE_CHECKING` imports included.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpufleet.errors import ForbiddenError

if TYPE_CHECKING:
    from fastapi import Request

    from gpufleet.lifecycle.accounts import Identity
    from gpufleet.server.loop import Loop
    from gpufleet.store import Store


@dataclass(frozen=True)
class Ctx:
    """The store, the caller's identity from a request, a way to wake the loop (a job submitted
    or cancelled), the loop itself."""

    store: Store
    who: Callable[[Request], Identity]
    wake: Callable[[], None]
    loop: Loop | None


class NoToken(ForbiddenError):
    """No token, or one no user has: 401, where a known user acting out of bounds is 403."""
