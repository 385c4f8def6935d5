"""Train the example GPT for a few steps under several layouts in one process group.

Argument: a JSON list of layouts, each {"strategy", "dp"?, "tp"?, "pp"?, "precision"?,
"schedule"?, "microbatches"?}. For each, every rank prints nothing; rank 0 prints one JSON line
with the distributed losses, the losses of the same training in one process (fp32 unless the
layout asks for mixed precision, in which case both), and every rank's model-state bytes.
A layout with "script_args" (framework deepspeed) is trained instead as a script that calls
`deepspeed.initialize(config=...)` itself, with the ds_config.json gpufleet writes for a job
given those arguments; its line holds the engine's batch sizes and the losses.
Run under torchrun; the test compares the numbers.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from gpufleet import train
from gpufleet.parallelism import resolve

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("gpt_example", ROOT / "examples" / "gpt.py")
assert spec and spec.loader
gpt = importlib.util.module_from_spec(spec)
sys.modules["gpt_example"] = gpt
spec.loader.exec_module(gpt)

SEQ, LAYERS, DIM, HEADS, BATCH, STEPS, SEED = 16, 4, 32, 4, 8, 3, 0


def dataset() -> Any:
    torch.manual_seed(123)
    data = torch.randint(0, 256, (SEQ * 400 + 1,), dtype=torch.uint8)
    return gpt.Windows(data, SEQ)


def fresh() -> tuple[Any, Any]:
    torch.manual_seed(SEED)
    model = gpt.GPT(SEQ, LAYERS, DIM, HEADS)
    # Two groups with different settings, as examples/gpt.py has: every strategy must keep them.
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    optim = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.5},
                               {"params": vectors, "weight_decay": 0.0}],
                              lr=1e-2, betas=(0.9, 0.95))
    return model, optim


def run(layout: Any) -> tuple[list[float], dict[str, int]]:
    model, optim = fresh()
    loader = DataLoader(dataset(), batch_size=BATCH, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(SEED))
    model, optim, loader = train.prepare(model, optim, loader, loss_fn=gpt.loss_fn, layout=layout)
    losses, state = [], {}
    it = iter(loader)
    for step in range(STEPS):
        x, y = next(it)
        loss = train.forward_backward(model, x, y)
        train.clip_grad_norm_(model, 1.0)
        optim.step()
        if step == 0:
            state = train.model_state_bytes(model, optim)
        optim.zero_grad()
        avg = loss.clone()
        dist.all_reduce(avg)
        losses.append(avg.item() / dist.get_world_size())
    return losses, state


def reference(dp: int, precision: str) -> list[float]:
    """The same training in one process: one replica, the whole global batch."""
    model, optim = fresh()
    ds = dataset()
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=SEED, drop_last=True)
    loader = DataLoader(ds, batch_size=BATCH * dp, sampler=sampler, drop_last=True)
    dtype = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler("cpu", enabled=precision == "fp16-mixed")
    losses = []
    it = iter(loader)
    for _ in range(STEPS):
        x, y = next(it)
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            out = model(x)
        loss = gpt.loss_fn(out, y)
        scaler.scale(loss).backward()
        scaler.unscale_(optim)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optim)
        scaler.update()
        optim.zero_grad()
        losses.append(loss.item())
    return losses


def own_deepspeed(layout: Any, script_args: list[str]) -> dict[str, Any]:
    """What a script gets from its own `deepspeed.initialize(config=PATH)` with the file
    `launch.frameworks.build` writes for a DeepSpeed job whose script takes `script_args`."""
    import deepspeed

    from gpufleet.launch.frameworks import build
    from gpufleet.launch.torchrun import JobContext
    from gpufleet.pool.model import Device, Placement
    from gpufleet.spec import JobSpec

    # gpufleet.train.prepare does the same: otherwise DeepSpeed compiles a CPU all-reduce op
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    world = dist.get_world_size()
    job_dir = Path(tempfile.mkdtemp(prefix="own-ds-"))
    spec = JobSpec(script="train.py", args=script_args, framework="deepspeed", strategy=layout.strategy)
    slots = tuple(Device(id=f"cpu{i}", index=i, gpu="cpu", memory_bytes=0) for i in range(world))
    ctx = JobContext(job_name="own-ds", cluster_name="c", job_dir=job_dir, report_addr="127.0.0.1:9",
                     fabric="pcie", python=sys.executable, host_cpus=1)
    cmd = build(spec, layout, Placement("local", "127.0.0.1", slots), ctx)
    path = job_dir / "ds_config.json"
    path.write_text(cmd.files[path.name])
    model, optim = fresh()
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optim, config=str(path))
    micro = engine.train_micro_batch_size_per_gpu()
    ds = dataset()
    loader = DataLoader(ds, batch_size=micro, drop_last=True,
                        sampler=DistributedSampler(ds, shuffle=True, seed=SEED, drop_last=True))
    losses = []
    for x, y in itertools.islice(loader, STEPS):
        loss = gpt.loss_fn(engine(x), y)
        engine.backward(loss)
        engine.step()
        avg = loss.detach().clone()
        dist.all_reduce(avg)
        losses.append(avg.item() / world)
    return {"micro": micro, "accum": engine.gradient_accumulation_steps(),
            "train_batch": engine.train_batch_size(), "losses": losses}


def main() -> None:
    ctx = train.setup(verify=False)
    configs = json.loads(sys.argv[1])
    for cfg in configs:
        layout = resolve(cfg["strategy"], ctx.world_size, dp=cfg.get("dp"), tp=cfg.get("tp"),
                         pp=cfg.get("pp"), precision=cfg.get("precision", "fp32"),
                         schedule=cfg.get("schedule", "1f1b"), microbatches=cfg.get("microbatches"),
                         framework=cfg.get("framework", "torchrun"))
        if "script_args" in cfg:
            own = own_deepspeed(layout, cfg["script_args"])
            if ctx.is_main:
                print("RESULT " + json.dumps({"config": cfg, **own}), flush=True)
            dist.barrier()
            continue
        losses, state = run(layout)
        states: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(states, state)
        if ctx.is_main:
            ref = reference(layout.dp, "fp32")
            out = {"config": cfg, "layout": layout.describe, "losses": losses, "fp32": ref,
                   "states": states,
                   "params_total": sum(p.numel() * 4 for p in fresh()[0].parameters())}
            if layout.precision != "fp32":
                out["same_precision"] = reference(layout.dp, layout.precision)
            print("RESULT " + json.dumps(out), flush=True)
        dist.barrier()
    train.cleanup()


if __name__ == "__main__":
    main()
