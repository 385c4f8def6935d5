"""Train the example GPT for a few steps under several layouts in one process group.

Argument: a JSON list of layouts, each {"strategy", "dp"?, "tp"?, "pp"?, "precision"?,
"schedule"?, "microbatches"?}. For each, every rank prints nothing; rank 0 prints one JSON line
with the distributed losses, the losses of the same training in one process (fp32 unless the
layout asks for mixed precision, in which case both), and every rank's model-state bytes.
Run under torchrun; the test compares the numbers.
"""

from __future__ import annotations

import importlib.util
import json
import sys
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


def main() -> None:
    ctx = train.setup(verify=False)
    configs = json.loads(sys.argv[1])
    for cfg in configs:
        layout = resolve(cfg["strategy"], ctx.world_size, dp=cfg.get("dp"), tp=cfg.get("tp"),
                         pp=cfg.get("pp"), precision=cfg.get("precision", "fp32"),
                         schedule=cfg.get("schedule", "1f1b"), microbatches=cfg.get("microbatches"),
                         framework=cfg.get("framework", "torchrun"))
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
