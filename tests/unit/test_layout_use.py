"""How a job's layout reads once the first step said who set it up."""

from __future__ import annotations

import json

from gpufleet.layout_use import describe, flags_given, note, stored

FSDP = json.dumps({"strategy": "fsdp", "framework": "torchrun", "precision": "fp32"})
PLAIN = json.dumps({"strategy": "ddp", "framework": "torchrun", "precision": "fp32"})
DEEPSPEED = json.dumps({"strategy": "ddp", "framework": "deepspeed", "precision": "fp32"})
WORDS = "fsdp, dp=2 x tp=1 x pp=1, fp32, torchrun"


def test_stored_values() -> None:
    assert stored(True, None) == "applied"
    assert stored(False, "fsdp2") == "own:fsdp2"
    assert stored(False, "something odd") == "own:none"


def test_flags_given_means_something_only_prepare_would_do() -> None:
    assert flags_given(FSDP) and flags_given(DEEPSPEED)
    assert flags_given(json.dumps({"strategy": "ddp", "precision": "bf16-mixed"}))
    assert flags_given(json.dumps({"strategy": "ddp", "tp": 2}))
    assert not flags_given(PLAIN)
    assert not flags_given("not json")


def test_a_layout_not_applied_is_never_shown_as_applied() -> None:
    text = describe(WORDS, "own:ddp", FSDP, ended=True)
    assert text is not None
    assert text.startswith("as written: the script's own DDP")
    assert "not applied" in text and WORDS in text
    assert "applied by gpufleet" not in text


def test_applied_and_unknown() -> None:
    assert describe(WORDS, "applied", FSDP, ended=False) == f"{WORDS} (applied by gpufleet)"
    assert describe(WORDS, None, FSDP, ended=False) == f"{WORDS} (requested; not confirmed yet)"
    assert describe(WORDS, None, FSDP, ended=True) == f"{WORDS} (requested)"
    assert describe(None, None, FSDP, ended=True) is None


def test_a_plain_script_with_no_layout_flags_is_not_told_of_a_missing_prepare() -> None:
    text = describe("ddp, dp=2 x tp=1 x pp=1, fp32, torchrun", "own:fsdp2", PLAIN, ended=True)
    assert text == "as written: the script's own FSDP2 (fully_shard)"


def test_the_event_text() -> None:
    assert note(True, None, "zero2, dp=2", 2, WORDS, FSDP) == \
        "gpufleet applied zero2, dp=2 on 2 rank(s) (prepare called)"
    told = note(False, "single", None, 2, WORDS, FSDP)
    assert "each rank trains alone" in told and "does not call gpufleet.train.prepare" in told


def test_accelerate_applies_its_own_strategies_but_not_a_mesh() -> None:
    accel = {"framework": "accelerate", "precision": "bf16-mixed"}
    assert not flags_given(json.dumps({**accel, "strategy": "fsdp"}))
    assert flags_given(json.dumps({**accel, "strategy": "zero1"}))
    assert flags_given(json.dumps({**accel, "strategy": "ddp", "tp": 2}))
    assert not flags_given(json.dumps({"strategy": "ddp", "dp": 2}))  # dp alone is plain DDP
