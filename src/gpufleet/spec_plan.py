"""PlanSpec: what `gpufleet plan` (and `bench scaling`) is asked, checked in one place as
`ClusterSpec` and `JobSpec` are in `spec.py`, whose helpers it shares. A module of its own so
that neither grows past a file one reads in a sitting."""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, ValidationError, field_validator

from gpufleet import catalog
from gpufleet.errors import SpecError
from gpufleet.spec import MAX_GPUS_PER_JOB, _errors, _Spec, parse_duration
from gpufleet.vocab import Framework, Network, Precision, Schedule, Strategy


class PlanSpec(_Spec):
    """What `gpufleet plan` is asked: a model, a workload and either one cluster (`gpu`, `count`,
    `network`, layout) or a deadline and/or budget to rank every cluster against. The planner
    itself (gpufleet.plan) is pure; this is where its input is checked."""

    model: str | None = None  # a catalog name
    params: float | None = Field(None, gt=0, le=1e15, allow_inf_nan=False)
    config: str | None = None  # a Hugging Face config.json
    gpu: str | None = None
    count: int | None = Field(None, ge=1, le=MAX_GPUS_PER_JOB)
    network: Network | None = None
    strategy: Strategy | None = None
    dp: int | None = Field(None, ge=1, le=MAX_GPUS_PER_JOB)
    tp: int | None = Field(None, ge=1, le=MAX_GPUS_PER_JOB)
    pp: int | None = Field(None, ge=1, le=MAX_GPUS_PER_JOB)
    pp_schedule: Schedule = "1f1b"
    microbatches: int | None = Field(None, ge=1, le=4096)
    # bf16 unless told: what large-model training uses (`run` defaults to fp32; pass the same
    # --precision to both).
    precision: Precision = "bf16-mixed"
    framework: Framework = "torchrun"
    micro_batch: int = Field(1, ge=1, le=65536)
    seq: int | None = Field(None, ge=1, le=10_000_000)
    grad_accum: int = Field(1, ge=1, le=4096)
    samples: int | None = Field(None, ge=1)
    lora: bool = False
    lora_rank: int | None = Field(None, ge=1, le=4096)
    checkpointing: bool = False  # full activation recomputation
    attention: Literal["flash", "eager"] = "flash"
    sequence_parallel: bool = False
    calibration: str | None = None
    deadline: str | None = None
    budget: float | None = Field(None, gt=0, allow_inf_nan=False)
    top: int | None = Field(None, ge=1, le=1000)

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, v: str | None) -> str | None:
        if v is None:
            return None
        try:
            return catalog.resolve_gpu(v).name
        except SpecError as exc:
            raise ValueError(exc.problems[0][1]) from None

    @field_validator("model")
    @classmethod
    def _model(cls, v: str | None) -> str | None:
        if v is None:
            return None
        try:
            return catalog.resolve_model(v).name
        except SpecError as exc:
            raise ValueError(exc.problems[0][1]) from None

    @field_validator("deadline")
    @classmethod
    def _deadline(cls, v: str | None) -> str | None:
        if v is not None:
            parse_duration(v)
        return v

    @property
    def searching(self) -> bool:
        return self.deadline is not None or self.budget is not None

    @property
    def deadline_h(self) -> float | None:
        return None if self.deadline is None else parse_duration(self.deadline) / 3600

    @classmethod
    def parse(cls, data: dict[str, Any], model_optional: bool = False) -> Self:
        """Validate; `model_optional` for `bench scaling`, where naming the model is optional."""
        data = {k: v for k, v in data.items() if v is not None}
        try:
            spec = cls.model_validate(data)
        except ValidationError as exc:
            raise SpecError(_errors(exc)) from None
        problems = spec._cross_field_problems()
        if model_optional:
            problems = [p for p in problems
                        if not (p[0] == "model" and spec.model is None and spec.params is None
                                and spec.config is None)]
        if problems:
            raise SpecError(problems)
        return spec

    def _cross_field_problems(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        given = [f"--{k}" for k in ("model", "params", "config") if getattr(self, k) is not None]
        if len(given) != 1:
            problems.append(("model", ("give one of --model NAME, --params N or --config FILE; got "
                                       + " and ".join(given)) if given else
                             "is required: --model NAME (`gpufleet plan --list-models`), "
                             "--params 7e9 or --config config.json"))
        if self.searching and self.samples is None:
            problems.append(("samples", "is required with --deadline or --budget: the ranking "
                             "compares the time and cost of training on that many samples"))
        if not self.searching and self.gpu is None:
            problems.append(("gpu", "is required to plan one cluster (e.g. --gpu H100 --count 8); "
                             "or rank every cluster with --deadline 24h and/or --budget 500"))
        if self.lora_rank is not None and not self.lora:
            problems.append(("lora_rank", "needs --lora"))
        if self.searching:
            fixed = [k for k in ("dp", "tp", "pp", "microbatches") if getattr(self, k) is not None]
            if fixed or self.pp_schedule != "1f1b":
                problems.append((fixed[0] if fixed else "pp_schedule",
                                 "a ranking chooses the mesh itself; drop --"
                                 + " --".join(k.replace("_", "-") for k in fixed or ["pp_schedule"])
                                 + ", or plan that one cluster with --gpu and --count"))
        else:
            if self.top is not None:
                problems.append(("top", "applies to a ranking (--deadline or --budget)"))
            if self.microbatches is not None and not (self.pp or 0) > 1 and self.strategy != "pp":
                problems.append(("microbatches", "are pipeline micro-batches and need --pp or "
                                 "--strategy pp; for gradient accumulation use --grad-accum"))
            if self.sequence_parallel and not (self.tp or 0) > 1 and self.strategy != "tp":
                problems.append(("sequence_parallel", "needs tensor parallelism (--tp 2 or more, "
                                 "or --strategy tp)"))
        if self.grad_accum > 1 and ((self.pp or 0) > 1 or self.strategy == "pp"):
            problems.append(("grad_accum", "with pipeline parallelism the micro-batches per step are "
                             "--microbatches"))
        return problems
