"""How a job splits its model over its workers: strategy, device mesh and precision, as data.

The CLI resolves and checks a `Layout` before any process starts; the supervisor passes it to
every worker in `GPUFLEET_*` variables, and `gpufleet.train.prepare` rebuilds it there. Keeping it
pure (no torch) lets the same rules run in the CLI in microseconds and in unit tests.

The mesh has three dimensions, outermost first: pipeline (`pp`), data (`dp`), tensor (`tp`).
Tensor parallelism is innermost so its ranks are neighbours (same node, fastest links), and
pipeline stages outermost since they only pass activations between neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.vocab import DATA_PARALLEL, FRAMEWORKS, PRECISIONS, SCHEDULES, STRATEGIES

# What each data-parallel method keeps whole on every rank; the rest is split dp ways.
# (ZeRO paper, Rajbhandari et al. 2020, section 5: stage 1 shards optimizer state, stage 2 adds
# gradients, stage 3 adds parameters. FSDP's full sharding is stage 3.)
SHARDED: dict[str, frozenset[str]] = {
    "ddp": frozenset(),
    "zero1": frozenset({"optimizer"}),
    "zero2": frozenset({"optimizer", "gradients"}),
    "zero3": frozenset({"optimizer", "gradients", "parameters"}),
    "fsdp": frozenset({"optimizer", "gradients", "parameters"}),
}


@dataclass(frozen=True)
class Layout:
    """A resolved plan: `data_parallel` says how the dp dimension shares the model."""

    strategy: str
    data_parallel: str
    dp: int
    tp: int
    pp: int
    precision: str = "fp32"
    schedule: str = "1f1b"
    microbatches: int = 1
    framework: str = "torchrun"

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def describe(self) -> str:
        dims = [f"{name}={n}" for name, n in (("dp", self.dp), ("tp", self.tp), ("pp", self.pp))]
        parts = [self.strategy, " x ".join(dims)]
        if self.dp > 1 and (self.tp > 1 or self.pp > 1):  # say what the dp dimension does
            parts.append(f"data parallel by {self.data_parallel}")
        if self.pp > 1:
            parts.append(f"{self.schedule} schedule, {self.microbatches} microbatches")
        parts.append(self.precision)
        return ", ".join(parts)

    def to_env(self) -> dict[str, str]:
        return {
            "GPUFLEET_STRATEGY": self.strategy,
            "GPUFLEET_DATA_PARALLEL": self.data_parallel,
            "GPUFLEET_MESH": f"dp={self.dp},tp={self.tp},pp={self.pp}",
            "GPUFLEET_PRECISION": self.precision,
            "GPUFLEET_PP_SCHEDULE": self.schedule,
            "GPUFLEET_MICROBATCHES": str(self.microbatches),
            "GPUFLEET_FRAMEWORK": self.framework,
        }

    @classmethod
    def from_env(cls, env: dict[str, str] | None, world_size: int) -> Layout:
        """The job's layout from its environment; plain DDP over every rank when gpufleet did not
        start the process (bare torchrun), so `prepare` still does something sensible."""
        env = env or {}
        if "GPUFLEET_MESH" not in env:
            return resolve("ddp", world_size, precision=env.get("GPUFLEET_PRECISION", "fp32"))
        dims = dict(part.split("=") for part in env["GPUFLEET_MESH"].split(","))
        layout = cls(
            strategy=env.get("GPUFLEET_STRATEGY", "ddp"),
            data_parallel=env.get("GPUFLEET_DATA_PARALLEL", "ddp"),
            dp=int(dims["dp"]), tp=int(dims["tp"]), pp=int(dims["pp"]),
            precision=env.get("GPUFLEET_PRECISION", "fp32"),
            schedule=env.get("GPUFLEET_PP_SCHEDULE", "1f1b"),
            microbatches=int(env.get("GPUFLEET_MICROBATCHES", "1")),
            framework=env.get("GPUFLEET_FRAMEWORK", "torchrun"),
        )
        if layout.world_size != world_size:
            raise ValueError(f"GPUFLEET_MESH {env['GPUFLEET_MESH']} holds {layout.world_size} "
                             f"ranks but WORLD_SIZE is {world_size}")
        return layout


class LayoutError(ValueError):
    """Problems with a requested layout, each as (field, message)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{f}: {m}" for f, m in problems))
        self.problems = problems


def resolve(strategy: str, world_size: int, *, dp: int | None = None, tp: int | None = None,
            pp: int | None = None, precision: str = "fp32", schedule: str = "1f1b",
            microbatches: int | None = None, framework: str = "torchrun") -> Layout:
    """The layout for `strategy` on `world_size` workers, with mesh dims the user fixed.

    `tp` and `pp` as strategies mean "all the workers along that dimension"; the others name the
    data-parallel method and leave dp to fill what tp x pp do not take. Dimensions left out
    default to 1, except the one the strategy fills. Raises LayoutError with every problem.
    """
    problems: list[tuple[str, str]] = []
    if strategy not in STRATEGIES:
        problems.append(("strategy", f"'{strategy}' is not allowed; allowed: {', '.join(STRATEGIES)}"))
    if precision not in PRECISIONS:
        problems.append(("precision", f"'{precision}' is not allowed; allowed: {', '.join(PRECISIONS)}"))
    if schedule not in SCHEDULES:
        problems.append(("pp_schedule", f"'{schedule}' is not allowed; allowed: {', '.join(SCHEDULES)}"))
    if framework not in FRAMEWORKS:
        problems.append(("framework", f"'{framework}' is not allowed; allowed: {', '.join(FRAMEWORKS)}"))
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp), ("microbatches", microbatches)):
        if value is not None and value < 1:
            problems.append((name, f"got {value}; must be at least 1"))
    if problems:
        raise LayoutError(problems)

    fill = {"tp": "tp", "pp": "pp"}.get(strategy, "dp")
    given = {"dp": dp, "tp": tp, "pp": pp}
    dims = {name: (1 if value is None and name != fill else value) for name, value in given.items()}
    others = 1
    for name, value in dims.items():
        if name != fill:
            others *= value or 1
    divides = True
    if dims[fill] is None:
        divides = world_size % others == 0
        if not divides:
            problems.append((fill, _product_message(dims, fill, world_size)))
        dims[fill] = max(1, world_size // others)
    d, t, p = (int(dims[k] or 1) for k in ("dp", "tp", "pp"))
    if divides and d * t * p != world_size:
        problems.append(("mesh", f"dp {d} x tp {t} x pp {p} = {d * t * p}, but the job has "
                         f"{world_size} workers; the product must equal the worker count"))
    if divides and strategy == "tp" and t == 1 and world_size > 1:
        problems.append(("tp", "strategy tp needs a tensor-parallel degree above 1"))
    if divides and strategy == "pp" and p == 1 and world_size > 1:
        problems.append(("pp", "strategy pp needs at least 2 pipeline stages"))
    data_parallel = strategy if strategy in DATA_PARALLEL else "ddp"
    if data_parallel == "zero1" and (t > 1 or p > 1):
        problems.append(("strategy", "zero1 shards the optimizer of whole parameters and does not "
                         "combine with tp or pp here; use one of: ddp, fsdp, zero2, zero3"))
    if microbatches is None:
        microbatches = p
    if p > 1 and schedule == "1f1b" and microbatches < p:
        problems.append(("microbatches", f"the 1f1b schedule needs at least as many microbatches "
                         f"as stages: got {microbatches} for {p} stages"))
    if problems:
        raise LayoutError(problems)
    return Layout(strategy=strategy, data_parallel=data_parallel, dp=d, tp=t, pp=p,
                  precision=precision, schedule=schedule, microbatches=microbatches,
                  framework=framework)


def _product_message(dims: dict[str, int | None], fill: str, world_size: int) -> str:
    fixed = " x ".join(f"{k} {v}" for k, v in dims.items() if k != fill and v)
    return (f"{world_size} workers do not divide by {fixed}; {fill} must make the product "
            "equal the worker count")


def model_problems(layout: Layout, layers: int | None, heads: int | None) -> list[tuple[str, str]]:
    """Checks that need the model's shape: each stage needs a layer, each tp rank whole heads."""
    problems: list[tuple[str, str]] = []
    if layers is not None and layout.pp > layers:
        problems.append(("pp", f"{layout.pp} pipeline stages but the model has {layers} layers; "
                         f"use at most {layers} stages"))
    if heads is not None and heads % layout.tp:
        divisors = [n for n in range(1, heads + 1) if heads % n == 0]
        problems.append(("tp", f"tensor-parallel degree {layout.tp} does not divide the model's "
                         f"{heads} attention heads; allowed: {', '.join(map(str, divisors))}"))
    return problems


def precision_problem(precision: str, gpu_name: str, bf16: bool, fp16: bool) -> str | None:
    """Refuse a precision the GPU cannot run natively (from the catalog's capability columns)."""
    if precision == "bf16-mixed" and not bf16:
        return (f"{gpu_name} has no BF16 support; allowed precisions on it: fp32"
                + (", fp16-mixed" if fp16 else ""))
    if precision == "fp16-mixed" and not fp16:
        return f"{gpu_name} has no FP16 support; allowed precisions on it: fp32"
    return None
