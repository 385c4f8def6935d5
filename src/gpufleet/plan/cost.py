"""Money: the one place that turns a cluster and a price book into dollars.

Every screen (launch quote, `list`, the live run view, `status`) calls these functions, so the
numbers a user sees always agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet import catalog


@dataclass(frozen=True)
class Rate:
    """An hourly rate for a whole cluster under one price book."""

    book: str
    usd_per_hour: float
    gpu_usd_per_hour: float  # per device
    premium_usd_per_hour: float  # interconnect premium per device
    instance: str


def cluster_rate(gpu: str, count: int, network: str, book: str) -> Rate | None:
    """Hourly cost of `count` devices of `gpu` on `network` under `book`; None if not offered.

    The marketplace charges a per-GPU premium for fast interconnects; a hyperscaler instance
    price already includes its fabric, so a book without a premium row adds nothing.
    """
    base = catalog.price_of(book, gpu)
    if base is None:
        return None
    premium = catalog.price_of(book, network)
    per_premium = premium.usd_per_gpu_hour if premium else 0.0
    return Rate(
        book=book,
        usd_per_hour=count * (base.usd_per_gpu_hour + per_premium),
        gpu_usd_per_hour=base.usd_per_gpu_hour,
        premium_usd_per_hour=per_premium,
        instance=base.instance,
    )


def quote(gpu: str, count: int, network: str) -> list[Rate]:
    """The rate under every book that offers this GPU type, cheapest first."""
    rates = [cluster_rate(gpu, count, network, b) for b in catalog.price_books()]
    return sorted((r for r in rates if r is not None), key=lambda r: r.usd_per_hour)


def default_book(gpu: str, count: int, network: str) -> str | None:
    """The book a cluster is billed under unless the user names one: the cheapest offering it."""
    rates = quote(gpu, count, network)
    return rates[0].book if rates else None


def cost_usd(usd_per_hour: float, seconds: float) -> float:
    """Dollars for running at `usd_per_hour` for `seconds` (accrued per second, no rounding up)."""
    return usd_per_hour * max(0.0, seconds) / 3600.0


def accrued_usd(usd_per_hour: float, started_at: float | None, ended_at: float | None,
                now: float, banked_usd: float = 0.0, rate_since: float | None = None) -> float:
    """Cost of a cluster so far: nothing before it started, frozen the moment it stopped.

    A cluster that changed size (elastic scaling) has the cost at its earlier rates banked and
    its current rate running from `rate_since`.
    """
    if started_at is None:
        return 0.0
    end = ended_at if ended_at is not None else now
    if rate_since is not None:
        return banked_usd + cost_usd(usd_per_hour, end - max(started_at, rate_since))
    return cost_usd(usd_per_hour, end - started_at)


def projected_usd(so_far: float, usd_per_hour: float, eta_s: float | None) -> float | None:
    """What a running job will have cost when it ends: so far, plus the rate over the ETA."""
    if eta_s is None:
        return None
    return so_far + cost_usd(usd_per_hour, eta_s)


def saving(rates: list[Rate]) -> tuple[float, float] | None:
    """(dollars per hour, fraction) saved by the cheapest book against the dearest."""
    if len(rates) < 2:
        return None
    low, high = rates[0].usd_per_hour, rates[-1].usd_per_hour
    return high - low, (high - low) / high if high else 0.0
