"""Money: rates per price book, quotes, and cost accrued per second."""

from __future__ import annotations

import pytest

from gpufleet.plan import cost


def test_marketplace_rate_adds_nvswitch_premium() -> None:
    rate = cost.cluster_rate("H100-SXM", 8, "nvswitch", "marketplace")
    assert rate is not None
    assert rate.book == "marketplace"
    assert rate.gpu_usd_per_hour == pytest.approx(2.20)
    assert rate.premium_usd_per_hour == pytest.approx(0.25)
    assert rate.usd_per_hour == pytest.approx(8 * (2.20 + 0.25))


@pytest.mark.parametrize(("network", "premium"), [("nvlink", 0.10), ("infiniband", 0.50)])
def test_marketplace_other_premiums(network: str, premium: float) -> None:
    rate = cost.cluster_rate("A100-80GB", 4, network, "marketplace")
    assert rate is not None
    assert rate.usd_per_hour == pytest.approx(4 * (1.49 + premium))


@pytest.mark.parametrize("network", ["pcie", "ethernet"])
def test_marketplace_no_premium_for_baseline_networks(network: str) -> None:
    rate = cost.cluster_rate("RTX4090", 2, network, "marketplace")
    assert rate is not None
    assert rate.premium_usd_per_hour == 0.0
    assert rate.usd_per_hour == pytest.approx(2 * 0.18)


def test_hyperscaler_rate_has_no_premium() -> None:
    rate = cost.cluster_rate("H100-SXM", 8, "nvswitch", "hyperscaler")
    assert rate is not None
    assert rate.premium_usd_per_hour == 0.0
    assert rate.usd_per_hour == pytest.approx(55.84)  # p5.48xlarge, fabric included
    assert rate.instance == "p5.48xlarge"


def test_rate_scales_with_count() -> None:
    one = cost.cluster_rate("H100-SXM", 1, "nvswitch", "marketplace")
    eight = cost.cluster_rate("H100-SXM", 8, "nvswitch", "marketplace")
    assert one is not None and eight is not None
    assert eight.usd_per_hour == pytest.approx(8 * one.usd_per_hour)


def test_rate_not_offered_is_none() -> None:
    assert cost.cluster_rate("H200", 8, "nvswitch", "marketplace") is None
    assert cost.cluster_rate("RTX4090", 1, "pcie", "hyperscaler") is None
    assert cost.cluster_rate("H100-SXM", 8, "pcie", "no-such-book") is None


def test_quote_cheapest_first() -> None:
    rates = cost.quote("H100-SXM", 8, "nvswitch")
    assert [r.book for r in rates] == ["marketplace", "hyperscaler"]
    assert [r.usd_per_hour for r in rates] == pytest.approx([8 * (2.20 + 0.25), 8 * 6.98])


def test_quote_only_books_that_offer_the_type() -> None:
    assert [r.book for r in cost.quote("RTX3090", 1, "pcie")] == ["marketplace"]
    assert [r.book for r in cost.quote("cpu", 2, "pcie")] == ["hyperscaler"]
    assert cost.quote("H200", 8, "nvswitch") == []


def test_quote_orders_by_price_not_by_file_order() -> None:
    # A100-40GB is offered by the hyperscaler only; A100-80GB by both, marketplace far cheaper.
    rates = cost.quote("A100-80GB", 8, "nvlink")
    assert [r.usd_per_hour for r in rates] == sorted(r.usd_per_hour for r in rates)
    assert rates[0].usd_per_hour == pytest.approx(8 * (1.49 + 0.10))
    assert rates[-1].usd_per_hour == pytest.approx(8 * 5.1207)


def test_default_book() -> None:
    assert cost.default_book("H100-SXM", 8, "nvswitch") == "marketplace"
    assert cost.default_book("A100-40GB", 8, "nvlink") == "hyperscaler"
    assert cost.default_book("cpu", 1, "pcie") == "hyperscaler"
    assert cost.default_book("H200", 8, "nvswitch") is None


def test_cost_usd_accrues_per_second() -> None:
    assert cost.cost_usd(36.0, 1) == pytest.approx(36.0 / 3600)
    assert cost.cost_usd(19.6, 90 * 60) == pytest.approx(19.6 * 1.5)
    assert cost.cost_usd(10.0, 0) == 0.0


def test_cost_usd_never_negative() -> None:
    assert cost.cost_usd(10.0, -5) == 0.0


def test_accrued_never_started_is_zero() -> None:
    assert cost.accrued_usd(19.6, None, None, now=1_000_000.0) == 0.0


def test_accrued_running_uses_now() -> None:
    start = 1_000.0
    assert cost.accrued_usd(19.6, start, None, now=start + 1800) == pytest.approx(19.6 / 2)
    assert cost.accrued_usd(19.6, start, None, now=start + 3600) == pytest.approx(19.6)


def test_accrued_stopped_is_frozen() -> None:
    start, stop = 1_000.0, 1_000.0 + 7200
    frozen = cost.accrued_usd(3.0, start, stop, now=stop)
    assert frozen == pytest.approx(3.0 * 2)
    assert cost.accrued_usd(3.0, start, stop, now=stop + 86_400) == pytest.approx(frozen)


def test_accrued_before_start_is_zero() -> None:
    # a clock that reads earlier than started_at (another host's clock) must not give negative money
    assert cost.accrued_usd(3.0, 1_000.0, None, now=900.0) == 0.0


def test_saving_cheapest_against_dearest() -> None:
    rates = cost.quote("H100-SXM", 8, "nvswitch")
    low, high = 8 * (2.20 + 0.25), 8 * 6.98
    result = cost.saving(rates)
    assert result is not None
    dollars, fraction = result
    assert dollars == pytest.approx(high - low)
    assert fraction == pytest.approx((high - low) / high)


def test_saving_needs_two_books() -> None:
    assert cost.saving(cost.quote("RTX3090", 1, "pcie")) is None
    assert cost.saving([]) is None


def test_saving_with_free_dearest_is_zero_fraction() -> None:
    free = cost.Rate(book="a", usd_per_hour=0.0, gpu_usd_per_hour=0.0, premium_usd_per_hour=0.0,
                     instance="")
    assert cost.saving([free, free]) == (0.0, 0.0)
