"""The pure parts of the collectives sweep (gpufleet.measure.collectives): size lists, the worker's
marker lines and nccl-tests style bandwidths. Importing the module does not import torch."""

from __future__ import annotations

import itertools
import json

import pytest

from gpufleet.measure.collectives import (
    DEFAULT_SIZES_CPU,
    MARKER,
    Row,
    parse_rows,
    parse_sizes,
)

# -- sizes -------------------------------------------------------------------------------------


def test_sizes_list() -> None:
    assert parse_sizes("1K,1M,64M") == (1024, 2**20, 64 * 2**20)


def test_sizes_list_sorted_and_deduplicated() -> None:
    assert parse_sizes("64M, 1K,1k,1KB") == (1024, 64 * 2**20)


def test_sizes_bare_bytes_and_fractions() -> None:
    assert parse_sizes("4,1.5K,1G") == (4, 1536, 2**30)


def test_sizes_range_powers_of_four() -> None:
    # 1 KiB, 4 KiB, 16 KiB, ... 64 MiB: 2^10, 2^12, ..., 2^26, nine sizes
    sizes = parse_sizes("1K:64M")
    assert sizes == tuple(2**p for p in range(10, 27, 2))
    assert sizes == DEFAULT_SIZES_CPU
    assert all(b == 4 * a for a, b in itertools.pairwise(sizes))


def test_sizes_range_stops_below_max() -> None:
    # 1K, 4K, 16K; 64K is above 32K
    assert parse_sizes("1K:32K") == (1024, 4096, 16384)


def test_sizes_range_single() -> None:
    assert parse_sizes("1M:1M") == (2**20,)


@pytest.mark.parametrize(
    "text",
    [
        "abc",  # not a number
        "1X",  # unknown suffix
        "K",  # suffix without a number
        "1K,,x",  # one bad token among good ones
        "2",  # below 4 bytes
        "32G",  # above 16 GiB
        "64M:1K",  # min above max
        "1K:abc",
    ],
)
def test_sizes_bad(text: str) -> None:
    with pytest.raises(ValueError):
        parse_sizes(text)


# -- marker lines -----------------------------------------------------------------------------


def _rec(op: str, size: int, seconds: float) -> str:
    return MARKER + json.dumps({"op": op, "bytes": size, "seconds": seconds})


def test_rows_plain_line() -> None:
    rows, failures = parse_rows([_rec("all_reduce", 1024, 0.001)], workers=4)
    assert rows == [Row("all_reduce", 1024, 0.001, 4)]
    assert failures == []


def test_rows_torchrun_prefix() -> None:
    line = "[default0]:" + _rec("all_gather", 4096, 0.002)
    rows, _ = parse_rows([line], workers=2)
    assert rows == [Row("all_gather", 4096, 0.002, 2)]


def test_rows_two_records_on_one_line() -> None:
    # two ranks' writes interleaved without a newline
    line = "[default0]:" + _rec("all_reduce", 1024, 0.001) + "[default1]:" + _rec("broadcast", 2048, 0.003)
    rows, _ = parse_rows([line], workers=4)
    assert [(r.op, r.bytes, r.seconds) for r in rows] == [("all_reduce", 1024, 0.001),
                                                          ("broadcast", 2048, 0.003)]


def test_rows_wrong_result_is_a_failure() -> None:
    line = "[default1]:" + MARKER + json.dumps({"wrong": "rank 1: all_reduce gave a wrong result"})
    rows, failures = parse_rows([line, _rec("all_reduce", 1024, 0.001)], workers=2)
    assert failures == ["rank 1: all_reduce gave a wrong result"]
    assert len(rows) == 1


def test_rows_junk_ignored() -> None:
    lines = [
        "",
        "W1130 torch/distributed/run.py: Setting OMP_NUM_THREADS",
        "[default0]:some training log",
        MARKER + "{not json",
        MARKER,
        MARKER + json.dumps({"op": "all_to_all", "bytes": 1, "seconds": 1.0}),  # an op we do not know
        _rec("reduce_scatter", 8192, 0.004),
    ]
    rows, failures = parse_rows(lines, workers=8)
    assert rows == [Row("reduce_scatter", 8192, 0.004, 8)]
    assert failures == []


def test_rows_empty() -> None:
    assert parse_rows([], workers=2) == ([], [])


def test_rows_non_object_json_ignored() -> None:
    lines = [MARKER + "42", MARKER + "[1, 2]", _rec("all_reduce", 1024, 0.001)]
    rows, failures = parse_rows(lines, workers=2)
    assert len(rows) == 1
    assert failures == []


# -- bandwidths ------------------------------------------------------------------------------


def test_row_algbw() -> None:
    # 4e9 bytes in 2 s = 2 GB/s
    assert Row("all_reduce", 4_000_000_000, 2.0, 4).algbw_gbps == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("op", "busbw"),
    [
        ("all_reduce", 3.0),  # 2 x 2 GB/s x 2 (n-1)/n = 2 x 3/4 x 2
        ("all_gather", 1.5),  # 2 x 3/4
        ("reduce_scatter", 1.5),
        ("broadcast", 2.0),  # x 1
    ],
)
def test_row_busbw_n4(op: str, busbw: float) -> None:
    row = Row(op, 4_000_000_000, 2.0, 4)
    assert row.algbw_gbps == pytest.approx(2.0)
    assert row.busbw_gbps == pytest.approx(busbw)


def test_row_zero_seconds() -> None:
    row = Row("all_reduce", 1024, 0.0, 4)
    assert row.algbw_gbps == 0.0
    assert row.busbw_gbps == 0.0


def test_row_point() -> None:
    p = Row("all_gather", 4_000_000_000, 2.0, 4).point()
    assert (p.op, p.bytes, p.seconds) == ("all_gather", 4_000_000_000, 2.0)
    assert p.algbw_gbps == pytest.approx(2.0)
    assert p.busbw_gbps == pytest.approx(1.5)


@pytest.mark.parametrize("text", ["", " , ,"])
def test_empty_size_list_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="no sizes"):
        parse_sizes(text)


def test_record_missing_a_field_is_skipped() -> None:
    rows, failures = parse_rows([MARKER + '{"op": "all_reduce"}', _rec("all_reduce", 1024, 0.001)], workers=2)
    assert len(rows) == 1 and failures == []
