"""Warm starts without processes: the launcher's command line, the spec's `preload`, the name a
warm rank gives its process and how telemetry reads it back (the real forkserver and workers
run in tests/integration/test_warm.py)."""

from __future__ import annotations

from typing import Any

import pytest
from placements import PY, cpu_placement, ctx

from gpufleet.errors import SpecError
from gpufleet.launch.frameworks import build
from gpufleet.launch.warm import split
from gpufleet.launch.warm_rank import process_name, rank_in_name
from gpufleet.spec import JobSpec


def argv(framework: str = "torchrun", **fields: Any) -> list[str]:
    s = JobSpec(script="train.py", framework=framework, args=["--lr", "3"], **fields)
    return build(s, s.layout(2), cpu_placement(2), ctx(), port=29611).argv


def test_warm_wraps_torchruns_own_arguments_and_plain_stays_torchrun() -> None:
    plain = argv(warm=False)
    warm = argv()  # the default
    assert plain[:3] == [PY, "-m", "torch.distributed.run"]
    assert warm[:4] == [PY, "-m", "gpufleet.launch.warm", "--"]
    assert warm[4:] == plain[3:]  # the same torchrun arguments, script and its arguments
    loaded = argv(warm=True, preload=["transformers", "datasets"])
    assert loaded[:6] == [PY, "-m", "gpufleet.launch.warm", "--preload",
                          "transformers,datasets", "--"]
    assert argv("deepspeed", warm=True)[:3] == [PY, "-m", "gpufleet.launch.warm"]
    assert "gpufleet.launch.warm" not in argv("accelerate", warm=True)  # its own launcher


def test_the_launcher_splits_its_own_options_from_torchruns() -> None:
    assert split(["--", "--standalone", "t.py"]) == ([], ["--standalone", "t.py"])
    assert split(["--preload", "a,b", "--preload=c", "--", "t.py", "--preload", "x"]) == (
        ["a", "b", "c"], ["t.py", "--preload", "x"])  # after --: the script's
    with pytest.raises(SystemExit, match="unknown option '--nproc'"):
        split(["--nproc", "2", "--", "t.py"])


def test_preload_takes_a_list_or_commas_and_refuses_what_is_not_a_module_name() -> None:
    assert JobSpec(script="t.py", preload="transformers, datasets,transformers").preload == [
        "transformers", "datasets"]
    assert JobSpec(script="t.py", preload=["a.b_c"]).preload == ["a.b_c"]
    assert JobSpec(script="t.py").preload == [] and JobSpec(script="t.py").warm is True
    assert JobSpec.parse({"script": "t.py", "preload": "transformers"}).preload == [
        "transformers"]  # warm by default
    with pytest.raises(SpecError) as err:
        JobSpec.parse({"script": "t.py", "warm": False, "preload": "transformers"})
    assert err.value.problems == [("preload", "modules are preloaded for warm starts only; drop "
                                   "--no-warm (warm: false) or --preload")]
    with pytest.raises(SpecError) as err:
        JobSpec.parse({"script": "t.py", "warm": True, "preload": "torch,1x"})
    assert err.value.problems == [("preload", "'1x' is not a module name: use importable names "
                                   "such as transformers,datasets")]


def test_a_warm_ranks_process_name_carries_its_ranks_for_telemetry() -> None:
    name = process_name({"RANK": "12", "LOCAL_RANK": "4"})
    assert name == "gfr12l4" and len(process_name({"RANK": "12345678", "LOCAL_RANK": "7"})) <= 15
    assert rank_in_name(name, "RANK") == "12" and rank_in_name(name, "LOCAL_RANK") == "4"
    assert rank_in_name("python3", "RANK") is None
    assert rank_in_name("gfr1l", "RANK") is None  # a name cut short is no rank


def test_a_launchers_fallback_note_is_the_jobs_warm_off_event_and_names_no_pid() -> None:
    from gpufleet.supervise.notes import note_of
    from gpufleet.telemetry import wire

    rec = wire.note_record("warm_off", t=1.0, rank=-1, pid=None, node="10.0.0.7",
                           fields={"why": "--preload x could not be imported: ImportError()"})
    assert wire.PID not in rec
    note, event = note_of(rec)
    assert (note.kind, note.rank) == ("warm_off", -1)
    assert event is not None and event.kind == "warm_off"
    assert event.text == ("workers started cold on 10.0.0.7: --preload x could not be "
                          "imported: ImportError()")
