"""The static look at a script: which distributed setup it calls (syntax tree, pattern fallback),
and the warnings for layout flags or a framework it will not use; plus the CPU jobs' variable
that makes an Accelerator() join torchrun's group."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from placements import cpu_placement, ctx, gpu_placement

from gpufleet.launch.frameworks import build
from gpufleet.launch.script_scan import Applied, Setup, scan, script_warnings, warnings
from gpufleet.spec import JobSpec

ROOT = Path(__file__).resolve().parents[2]
WORKERS = ROOT / "tests" / "integration" / "workers"

NANOGPT_LIKE = """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group
ddp = True
if ddp:
    init_process_group(backend=backend)
    model = DDP(model, device_ids=[ddp_local_rank])
"""
FSDP2 = """
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
mesh = init_device_mesh("cpu", (2,))
for block in model.blocks:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
"""
ACCELERATE = """
from accelerate import Accelerator
accelerator = Accelerator()
model, opt, dl = accelerator.prepare(model, opt, dl)
"""
PREPARE_FORMS = [
    "from gpufleet.train import prepare\nm, o, l = prepare(m, o, l)",
    "from gpufleet.train import prepare as lay_out\nm, o, l = lay_out(m, o, l)",
    "from gpufleet import train\ntrain.setup()\nm, o, l = train.prepare(m, o, l)",
    "import gpufleet.train as gt\nm, o, l = gt.prepare(m, o, l)",
    "import gpufleet\nm, o, l = gpufleet.train.prepare(m, o, l)",
]
# Mentions that are not calls: comments, strings, docstrings, a method of another object.
NOT_CALLS = '''
"""Unlike train.prepare(model), this script uses deepspeed.initialize( nothing."""
# model = FSDP(model); init_process_group("gloo"); Accelerator()
text = "DistributedDataParallel(model) and init_device_mesh(...)"
model, opt = accelerator.prepare(model, opt)
'''


def spec(script: str = "train.py", **fields: Any) -> JobSpec:
    return JobSpec(script=script, **fields)


# ---------------------------------------------------------------- scan


def test_nanogpt_style_script_is_its_own_ddp() -> None:
    found = scan(NANOGPT_LIKE)
    assert found.parsed
    assert found.calls == {Setup.PROCESS_GROUP, Setup.DDP}


def test_fsdp2_script_shards_itself_on_its_own_mesh() -> None:
    assert scan(FSDP2).calls == {Setup.DEVICE_MESH, Setup.FSDP}


def test_fsdp1_wrappers_count_as_fsdp() -> None:
    source = ("from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
              "a = FSDP(m)\nb = torch.distributed.fsdp.FullyShardedDataParallel(m)\n")
    assert scan(source).calls == {Setup.FSDP}


def test_accelerate_script_is_an_accelerator_not_prepare() -> None:
    assert scan(ACCELERATE).calls == {Setup.ACCELERATOR}


@pytest.mark.parametrize("source", PREPARE_FORMS)
def test_every_form_of_gpufleet_prepare_is_found(source: str) -> None:
    assert Setup.PREPARE in scan(source).calls


def test_deepspeed_initialize_found_under_an_alias() -> None:
    source = "import deepspeed as ds\nengine, opt, _, _ = ds.initialize(model=m, config=c)\n"
    assert scan(source).calls == {Setup.DEEPSPEED}


def test_comments_strings_and_other_prepares_are_not_calls() -> None:
    found = scan(NOT_CALLS)
    assert found.parsed
    assert found.calls == frozenset()


def test_unparsable_file_falls_back_to_patterns_without_comments() -> None:
    source = ("def broken(:\n"
              "    # model = FSDP(model)\n"
              "    deepspeed.initialize(model=m)\n"
              "    acc = Accelerator()  # not DDP(x)\n")
    found = scan(source)
    assert not found.parsed
    assert found.calls == {Setup.DEEPSPEED, Setup.ACCELERATOR}


def test_real_worker_scripts() -> None:
    assert scan((WORKERS / "plain_ddp.py").read_text()).calls == {Setup.PROCESS_GROUP, Setup.DDP}
    assert scan((WORKERS / "accel_plain.py").read_text()).calls == {Setup.ACCELERATOR}
    assert Setup.PREPARE in scan((ROOT / "examples" / "gpt.py").read_text()).calls


# ---------------------------------------------------------------- warnings


def test_fsdp_on_an_own_ddp_script_warns_with_what_runs() -> None:
    notes = warnings(scan(NANOGPT_LIKE), spec("nano/train.py", strategy="fsdp"))
    assert [n.about for n in notes] == [Applied.LAYOUT]
    assert notes[0].message == ("--strategy fsdp is applied by gpufleet.train.prepare, which "
                                "train.py does not call: the script runs as written (its own DDP)")


def test_all_unapplied_flags_are_named_in_one_line() -> None:
    notes = warnings(scan(FSDP2), spec(strategy="fsdp", tp=2, dp=1, precision="bf16-mixed"))
    assert len(notes) == 1
    message = notes[0].message
    for flag in ("--strategy fsdp", "--tp 2", "--dp 1", "--precision bf16-mixed"):
        assert flag in message
    assert " are applied by " in message and "(its own FSDP)" in message


@pytest.mark.parametrize("source", PREPARE_FORMS)
def test_a_prepare_script_gets_no_warning(source: str) -> None:
    assert warnings(scan(source), spec(strategy="zero2", framework="deepspeed",
                                       precision="bf16-mixed")) == []


def test_plain_flags_on_an_ordinary_script_warn_nothing() -> None:
    assert warnings(scan(NANOGPT_LIKE), spec()) == []
    assert warnings(scan(NANOGPT_LIKE), spec(dp=2)) == []


def test_deepspeed_without_initialize_or_prepare_warns_twice() -> None:
    notes = warnings(scan(NANOGPT_LIKE), spec(framework="deepspeed", strategy="zero2"))
    assert [n.about for n in notes] == [Applied.LAYOUT, Applied.FRAMEWORK]
    assert "ds_config.json is not used" in notes[1].message


def test_deepspeed_script_of_its_own_gets_only_the_layout_warning() -> None:
    found = scan("import deepspeed\ne, o, _, _ = deepspeed.initialize(model=m)\n")
    notes = warnings(found, spec(framework="deepspeed", strategy="zero3"))
    assert [n.about for n in notes] == [Applied.LAYOUT]
    assert "(its own deepspeed.initialize)" in notes[0].message
    assert warnings(found, spec(framework="deepspeed")) == []


def test_accelerate_framework_without_an_accelerator_warns() -> None:
    notes = warnings(scan(NANOGPT_LIKE), spec(framework="accelerate"))
    assert [n.about for n in notes] == [Applied.FRAMEWORK]
    assert "accelerate.yaml is not used" in notes[0].message
    assert "(its own DDP)" in notes[0].message


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "zero2", "zero3"])
def test_accelerate_config_lays_out_an_accelerator_script(strategy: str) -> None:
    assert warnings(scan(ACCELERATE), spec(framework="accelerate", strategy=strategy,
                                           precision="bf16-mixed")) == []


@pytest.mark.parametrize("fields", [{"strategy": "zero1"}, {"strategy": "fsdp", "tp": 2},
                                    {"strategy": "tp"}])
def test_what_accelerates_config_cannot_carry_still_warns(fields: dict[str, Any]) -> None:
    notes = warnings(scan(ACCELERATE), spec(framework="accelerate", **fields))
    assert [n.about for n in notes] == [Applied.LAYOUT]
    assert "(its own Accelerator)" in notes[0].message


def test_accelerator_under_torchrun_gets_no_layout_from_accelerate() -> None:
    notes = warnings(scan(ACCELERATE), spec(strategy="fsdp"))
    assert [n.about for n in notes] == [Applied.LAYOUT]


def test_a_script_with_no_setup_is_said_to_train_alone() -> None:
    notes = warnings(scan("import torch\nprint(torch.ones(1))\n"), spec(strategy="fsdp"))
    assert "each rank may train alone" in notes[0].message


def test_an_unreadable_script_is_not_warned_about() -> None:
    assert script_warnings(spec(strategy="fsdp", framework="deepspeed"), None) == []
    assert script_warnings(spec(strategy="fsdp"), NANOGPT_LIKE) != []


def test_warnings_leave_the_spec_as_it_was() -> None:
    s = spec(strategy="fsdp", framework="deepspeed")
    before = s.model_dump()
    warnings(scan(NANOGPT_LIKE), s)
    assert s.model_dump() == before


# ---------------------------------------------------------------- CPU jobs tell Accelerate


@pytest.mark.parametrize("framework", ["torchrun", "accelerate", "deepspeed", "ray"])
def test_every_cpu_job_tells_accelerate_to_use_the_cpu(framework: str) -> None:
    s = spec(framework=framework)
    cmd = build(s, s.layout(2), cpu_placement(2), ctx())
    assert cmd.env["ACCELERATE_USE_CPU"] == "true"


def test_a_gpu_job_leaves_accelerate_on_the_gpus() -> None:
    s = spec()
    cmd = build(s, s.layout(2), gpu_placement([0, 1]), ctx())
    assert "ACCELERATE_USE_CPU" not in cmd.env


def test_imports_gpufleet() -> None:
    from gpufleet.launch.script_scan import imports_gpufleet

    assert imports_gpufleet("from gpufleet import train\n")
    assert imports_gpufleet("import gpufleet.train as t\n")
    assert not imports_gpufleet("import torch  # gpufleet would be nice\ns = 'import gpufleet'\n")
    assert imports_gpufleet("def broken(:\nfrom gpufleet import train\n")  # the fallback
