"""Every strategy, mesh and precision trains the example GPT like one process does, and shards.

Real gloo process groups under torchrun on CPU: `workers/strategies.py` trains a tiny GPT
(4 layers, dim 32, 4 heads) for 3 steps under each layout in one launch, and a single-process
run of the same seed and data as reference. Tolerances (stated in docs/strategies.md):
- fp32: losses equal the single-process fp32 losses to 1e-4 relative (only summation order
  differs; seen ~1e-7);
- bf16-mixed: within 0.01 of fp32 (bf16 keeps ~3 significant digits; seen ~5e-4);
- fp16-mixed: within 1e-3 of single-process fp16 with torch's GradScaler, and 0.01 of fp32.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from strategy_runs import DEEPSPEED, FOUR, OWN_DEEPSPEED, TWO, assert_losses, key, torchrun

# `two_ranks` and `four_ranks` (conftest.py): one launch each, shared with test_plan_measured.py


@pytest.mark.parametrize("cfg", TWO, ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_two_ranks_match_one_process(two_ranks: dict[str, dict[str, Any]], cfg: dict[str, Any]) -> None:
    assert_losses(two_ranks[key(cfg)])


@pytest.mark.parametrize("cfg", FOUR, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_four_ranks_match_one_process(four_ranks: dict[str, dict[str, Any]], cfg: dict[str, Any]) -> None:
    assert_losses(four_ranks[key(cfg)])


def _share(r: dict[str, Any], what: str) -> list[float]:
    """Each rank's bytes of `what` as a fraction of the whole fp32 model's parameter bytes."""
    return [s[f"{what}_bytes"] / r["params_total"] for s in r["states"]]


def test_ddp_holds_everything_on_every_rank(two_ranks: dict[str, dict[str, Any]]) -> None:
    r = two_ranks[key({"strategy": "ddp"})]
    assert _share(r, "params") == [1.0, 1.0]
    assert _share(r, "grads") == [1.0, 1.0]
    assert _share(r, "optimizer") == [2.0, 2.0]  # Adam: two moments per parameter


def test_zero1_shards_only_the_optimizer(two_ranks: dict[str, dict[str, Any]]) -> None:
    r = two_ranks[key({"strategy": "zero1"})]
    assert _share(r, "params") == [1.0, 1.0]
    assert _share(r, "grads") == [1.0, 1.0]
    # ZeroRedundancyOptimizer splits whole parameters, so halves are close, not exact
    assert sum(_share(r, "optimizer")) == pytest.approx(2.0)
    assert all(0.8 < s < 1.2 for s in _share(r, "optimizer"))


@pytest.mark.parametrize("strategy", ["fsdp", "zero2", "zero3"])
def test_fsdp_family_shards_params_grads_and_optimizer(two_ranks: dict[str, dict[str, Any]],
                                                      strategy: str) -> None:
    r = two_ranks[key({"strategy": strategy})]
    for p, g, o in zip(_share(r, "params"), _share(r, "grads"), _share(r, "optimizer"), strict=True):
        assert p == pytest.approx(0.5, rel=0.02)  # FSDP pads a shard to a whole row at most
        assert g == pytest.approx(p)
        assert o == pytest.approx(2 * p)


def test_zero3_on_four_ranks_holds_a_quarter(four_ranks: dict[str, dict[str, Any]]) -> None:
    r = four_ranks[key({"strategy": "zero3"})]
    assert all(s == pytest.approx(0.25, rel=0.03) for s in _share(r, "params"))


def test_pipeline_stages_split_the_model_exactly(two_ranks: dict[str, dict[str, Any]],
                                                four_ranks: dict[str, dict[str, Any]]) -> None:
    r = two_ranks[key({"strategy": "pp"})]
    assert sum(_share(r, "params")) == pytest.approx(1.0)
    assert all(0.3 < s < 0.7 for s in _share(r, "params"))
    r4 = four_ranks[key({"strategy": "pp", "schedule": "gpipe"})]
    assert sum(_share(r4, "params")) == pytest.approx(1.0)


def test_tensor_parallel_shards_the_blocks_not_the_embeddings(two_ranks: dict[str, dict[str, Any]]) -> None:
    shares = _share(two_ranks[key({"strategy": "tp"})], "params")
    # blocks split in two; embeddings, norms and head stay whole on both ranks
    assert all(0.5 < s < 1.0 for s in shares)
    assert shares[0] == shares[1]


def test_2d_mesh_shards_over_both_dimensions(four_ranks: dict[str, dict[str, Any]]) -> None:
    tp_only = _share(four_ranks[key({"strategy": "tp"})], "params")[0]  # tp=4
    fsdp_tp = _share(four_ranks[key({"strategy": "fsdp", "dp": 2, "tp": 2})], "params")
    ddp_tp = _share(four_ranks[key({"strategy": "ddp", "dp": 2, "tp": 2})], "params")
    assert all(f == pytest.approx(d / 2, rel=0.03) for f, d in zip(fsdp_tp, ddp_tp, strict=True))
    assert tp_only < ddp_tp[0]


def test_checkpoint_moves_from_ddp_on_two_to_fsdp_and_pipeline_on_four(tmp_path: Path) -> None:
    path = str(tmp_path / "ckpt")
    saved = json.loads(torchrun(2, "resume.py", '{"strategy": "ddp"}', "16", path, "save", "4")
                       .split("RESULT ")[1])
    assert (tmp_path / "ckpt" / ".metadata").is_file()
    for nproc, layout in ((4, '{"strategy": "fsdp"}'), (4, '{"strategy": "pp", "dp": 2}')):
        resumed = json.loads(torchrun(nproc, "resume.py", layout, "16", path, "load", "4")
                             .split("RESULT ")[1])
        assert resumed["start"] == 2
        # step 3 checks the weights, step 4 also the Adam moments the checkpoint carried
        for step in ("3", "4"):
            assert resumed["losses"][step] == pytest.approx(saved["losses"][step], rel=1e-5), layout


def test_deepspeed_zero_stages_match_one_process(two_ranks: dict[str, dict[str, Any]]) -> None:
    """The same script under --framework deepspeed: DeepSpeed's engine with the generated config
    (ZeRO stage from the strategy), the script's own AdamW, clipping handed to the engine."""
    for cfg in DEEPSPEED:
        r = two_ranks[key(cfg)]
        assert_losses(r)
        optimizer = _share(r, "optimizer")
        expected = 2.0 if cfg["strategy"] == "ddp" else 1.0  # stages 1-3 split Adam's state in two
        assert all(o == pytest.approx(expected, rel=0.02) for o in optimizer), r["layout"]


def test_a_scripts_own_deepspeed_initialize_accepts_the_generated_config(
        two_ranks: dict[str, dict[str, Any]]) -> None:
    """A script calling `deepspeed.initialize(config=GPUFLEET_DEEPSPEED_CONFIG)` itself, not
    through gpufleet.train: DeepSpeed's engine takes the file's batch sizes (its own check that
    train_batch_size = micro x accumulation x data-parallel workers passed) and trains."""
    r = two_ranks[key(OWN_DEEPSPEED)]
    assert (r["micro"], r["accum"], r["train_batch"]) == (4, 1, 4 * 2)  # --batch-size 4, 2 ranks
    assert len(r["losses"]) == 3 and all(math.isfinite(x) for x in r["losses"])
    assert r["losses"][-1] != r["losses"][0], "training did not move"


def test_deepspeed_checkpoint_resumes_under_deepspeed(tmp_path: Path) -> None:
    """DeepSpeed jobs checkpoint in DeepSpeed's own format (its engine owns the partitions)."""
    path, layout = str(tmp_path / "ds"), '{"strategy": "zero2", "framework": "deepspeed"}'
    saved = json.loads(torchrun(2, "resume.py", layout, "16", path, "save", "4").split("RESULT ")[1])
    resumed = json.loads(torchrun(2, "resume.py", layout, "16", path, "load", "4").split("RESULT ")[1])
    assert resumed["start"] == 2
    for step in ("3", "4"):
        assert resumed["losses"][step] == pytest.approx(saved["losses"][step], rel=1e-5)


@pytest.mark.parametrize("tail, code", [("print('done', flush=False)", 0), ("raise RuntimeError('late')", 1)])
def test_cleanup_exit_keeps_output_and_failures(tmp_path: Path, tail: str, code: int) -> None:
    """cleanup() skips the interpreter's last teardown (a gloo abort there would fail a finished
    job), but unflushed output still comes out and an exception after it still fails."""
    script = tmp_path / "w.py"
    script.write_text("import atexit\nfrom gpufleet import train\n"
                      "atexit.register(lambda: print('user handler ran', flush=True))\n"
                      f"train.setup(verify=False)\ntrain.cleanup()\n{tail}\n")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(script)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == code, proc.stderr[-2000:]
    assert proc.stdout.count("user handler ran") == 2
    if code == 0:
        assert proc.stdout.count("done") == 2
    else:
        assert "RuntimeError: late" in proc.stderr


def test_cleanup_keeps_the_groups_a_freed_model_would_destroy(tmp_path: Path) -> None:
    """A DDP model freed after cleanup() (at the script's `main()` return, as examples/mlp.py's)
    no longer frees its gloo group: that destructor, run holding the GIL, waited forever for
    gloo's thread, itself waiting for the GIL to free the barrier's work (it holds the last
    all-reduce of a tensor Python had seen): a rank that never ended after its last line, 1 run
    in 8 on a loaded machine. A warm rank keeps every group the script leaves, cleanup()'s too,
    until it ends through os._exit (launch/warm_rank.py)."""
    script = tmp_path / "w.py"
    script.write_text(
        "import gc, weakref\nimport torch\nimport torch.distributed as dist\n"
        "from gpufleet import train\n"
        "def main():\n"
        "    train.setup(verify=False)\n"
        "    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))\n"
        "    model(torch.randn(2, 4)).sum().backward()\n"
        "    group = weakref.ref(dist.group.WORLD)\n"
        "    train.cleanup()\n"
        "    return group\n"
        "group = main()\n"  # the model and its reducer are freed with main's frame
        "gc.collect()\n"
        "print('group kept' if group() is not None else 'group freed', flush=True)\n")
    # warm ranks, gpufleet's default, where it hung (under bare torchrun something of torch's
    # own still held the group here, so the model's end did not free it)
    proc = subprocess.run([sys.executable, "-m", "gpufleet.launch.warm", "--", "--standalone",
                           "--nproc-per-node", "2", str(script)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("group kept") == 2, proc.stdout


def test_pipeline_stages_keep_every_optimizer_group(tmp_path: Path) -> None:
    out = torchrun(2, "pp_groups.py", str(tmp_path / "ckpt"))
    # both ranks print; their lines can interleave, so find each flat JSON object
    rows = [json.loads(m) for m in re.findall(r"RESULT (\{[^{}]*\})", out)]
    assert len(rows) == 2, out
    by_rank = {r["rank"]: r for r in rows}
    assert by_rank[0]["sizes"][0] > 0 and by_rank[1]["sizes"][0] == 0  # stage 1 has no embeddings
    for r in rows:
        assert r["step"] == 1
        assert r["lrs"] == pytest.approx([1e-3, 5e-3])  # settings and schedule survive the load
