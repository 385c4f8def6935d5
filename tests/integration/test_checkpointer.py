"""train.Checkpointer on real files: durable copies (a folder and an fsspec URL), keep-K, the
time cadence, async saves, and a 4-rank staggered save resumed on 2 ranks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import fsspec
import pytest
import torch
from fleet_helpers import WORKERS
from torch import nn

from gpufleet.train import ckpt_files
from gpufleet.train.checkpointer import Checkpointer

SURVIVE = str(WORKERS / "survive.py")


def model_and_optim(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()
    optim.step()  # so Adam has state to save
    return model, optim


def same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                  b.state_dict().values(), strict=True))


@pytest.fixture(autouse=True)
def no_supervisor(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GPUFLEET_CONTROL_FILE", "GPUFLEET_CHECKPOINT_DIR", "GPUFLEET_CHECKPOINT_TO",
                 "GPUFLEET_REPORT_ADDR"):
        monkeypatch.delenv(name, raising=False)


def test_durable_folder_keeps_the_newest_and_resumes_when_local_is_gone(tmp_path: Path) -> None:
    local, durable = tmp_path / "local", tmp_path / "durable"
    model, optim = model_and_optim(0)
    ckpt = Checkpointer(model, optim, dir=local, durable=str(durable), every_steps=2, keep=2)
    for step in range(1, 7):
        ckpt.step(step)
    ckpt.close()
    assert [s for s, _ in ckpt_files.complete(local)] == [6, 4]
    assert [s for s, _ in ckpt_files.complete(durable)] == [6, 4]
    assert all(ckpt_files.check(p).ok for _, p in ckpt_files.complete(durable))
    assert not list(durable.glob("*.partial")), "no half-copied folder is left"
    import shutil

    shutil.rmtree(local)
    other, other_optim = model_and_optim(1)
    assert not same(model, other)
    again = Checkpointer(other, other_optim, dir=local, durable=str(durable), every_steps=2)
    assert again.resume() == 6
    assert same(model, other)
    assert other_optim.state_dict()["state"][0]["exp_avg"].equal(
        optim.state_dict()["state"][0]["exp_avg"])


def test_fsspec_url_durable_copy_is_fetched_on_resume(tmp_path: Path) -> None:
    url = f"memory://gpufleet-test-{uuid.uuid4().hex}"
    model, optim = model_and_optim(0)
    ckpt = Checkpointer(model, optim, dir=tmp_path / "a", durable=url, every_steps=3, keep=1)
    for step in range(1, 7):
        ckpt.step(step)
    ckpt.close()
    try:
        assert [s for s, _ in ckpt_files.remote_complete(url)] == [6]
        other, other_optim = model_and_optim(1)
        again = Checkpointer(other, other_optim, dir=tmp_path / "b", durable=url)
        assert again.resume() == 6
        assert same(model, other)
        assert ckpt_files.check(tmp_path / "b" / "step-00000006").ok
    finally:
        fs, root = fsspec.core.url_to_fs(url)
        fs.rm(root, recursive=True)


def test_time_cadence_and_no_checkpoint_means_step_zero(tmp_path: Path) -> None:
    model, optim = model_and_optim(0)
    fresh = Checkpointer(model, optim, dir=tmp_path)
    assert fresh.resume() == 0
    ckpt = Checkpointer(model, optim, dir=tmp_path, every_minutes=0.01 / 60)  # 10 ms
    time.sleep(0.02)
    assert ckpt.step(1)
    assert not ckpt.step(2), "10 ms have not passed since the last save"
    time.sleep(0.02)
    assert ckpt.step(3)
    slow = Checkpointer(model, optim, dir=tmp_path / "slow", every_minutes=60)
    assert not slow.step(3)
    assert [s for s, _ in ckpt_files.complete(tmp_path)] == [3, 1]


def test_bad_arguments_name_the_field(tmp_path: Path) -> None:
    model, optim = model_and_optim(0)
    for kwargs, field in (({"keep": 0}, "keep"), ({"every_steps": 0}, "every_steps"),
                          ({"every_minutes": -1.0}, "every_minutes")):
        with pytest.raises(ValueError, match=field):
            Checkpointer(model, optim, dir=tmp_path, **kwargs)  # type: ignore[arg-type]


def _torchrun(n: int, args: list[str], cwd: Path, env: dict[str, str]) -> None:
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", str(n), SURVIVE, *args], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def test_four_ranks_staggered_async_save_resumes_on_two(tmp_path: Path) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    base["GPUFLEET_TELEMETRY"] = "0"
    ref, run = tmp_path / "ref", tmp_path / "run"
    ref.mkdir()
    run.mkdir()
    _torchrun(4, ["--steps", "20", "--every", "100", "--losses", str(ref / "l.jsonl"),
                  "--out", str(ref / "w.pt")], ref, {**base, "GPUFLEET_CHECKPOINT_DIR": str(ref)})
    common = ["--every", "5", "--writers", "1", "--async-save", "--losses", str(run / "l.jsonl"),
              "--out", str(run / "w.pt")]
    env = {**base, "GPUFLEET_CHECKPOINT_DIR": str(run / "ck")}
    _torchrun(4, ["--steps", "10", *common], run, env)
    folder = run / "ck" / "step-00000010"
    assert ckpt_files.check(folder).ok
    assert {f"sums-rank{r}.json" for r in range(4)} <= {p.name for p in folder.iterdir()}
    # half the ranks, twice the micro-batches: the same global batch from step 11 on
    _torchrun(2, ["--steps", "20", *common], run, {**env, "GPUFLEET_GRAD_ACCUM": "2"})
    got, want = torch.load(run / "w.pt"), torch.load(ref / "w.pt")
    assert all(torch.allclose(got[k], want[k], rtol=1e-4, atol=1e-6) for k in want)


def test_a_corrupt_newer_checkpoint_is_set_aside_so_new_ones_are_kept(tmp_path: Path) -> None:
    """Left in place, a damaged step-4 would outrank every new save below it, and keep=1 would
    prune each new checkpoint the moment it was written."""
    model, optim = model_and_optim(0)
    ckpt = Checkpointer(model, optim, dir=tmp_path, every_steps=2, keep=2)
    for step in range(1, 5):
        ckpt.step(step)
    shard = tmp_path / "step-00000004" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(data)
    again = Checkpointer(model, optim, dir=tmp_path, every_steps=1, keep=1)
    assert again.resume() == 2
    assert again.step(3)
    assert [s for s, _ in ckpt_files.complete(tmp_path)] == [3]
    assert (tmp_path / "step-00000004.corrupt").is_dir(), "kept aside for a look"


def test_checkpoints_are_owner_only_unless_shared(tmp_path: Path) -> None:
    """The local folder and the durable copy: 0700 folders, 0600 files (weights are private
    data, and the durable copy lives outside the private home); `shared=True` leaves the
    umask's modes, as before."""
    import stat

    def modes(root: Path) -> set[tuple[str, int]]:
        out = set()
        for folder in root.glob("step-*"):
            out.add(("dir", stat.S_IMODE(folder.stat().st_mode)))
            out |= {("file", stat.S_IMODE(p.stat().st_mode)) for p in folder.iterdir()}
        return out

    model, optim = model_and_optim(0)
    old = os.umask(0o022)
    try:
        for shared, want in ((False, {("dir", 0o700), ("file", 0o600)}),
                             (True, {("dir", 0o755), ("file", 0o644)})):
            root = tmp_path / str(shared)
            ckpt = Checkpointer(model, optim, dir=root / "local", durable=str(root / "durable"),
                                every_steps=1, shared=shared)
            ckpt.step(1)
            ckpt.close()
            assert modes(root / "local") == want, shared
            assert modes(root / "durable") == want, shared
    finally:
        os.umask(old)
