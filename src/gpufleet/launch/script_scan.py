"""A static look at a training script: which distributed setup it calls, and which of the job's
layout flags will therefore not be applied. Pure: the script's text and the job spec in, data out.

Layout flags (--strategy, --tp, --pp, --precision, DeepSpeed's ZeRO stage) reach a script only
through `gpufleet.train.prepare`, or, under --framework accelerate, through Accelerate's config
for a script that builds an `Accelerator()`. A script that does neither runs as written: its own
DDP, FSDP or nothing at all. Users bring such scripts (nanoGPT, the PyTorch examples), so the CLI
says so before the start instead of letting a job labelled `fsdp` run plain DDP. The scan reads
the syntax tree, so a call in a comment or a string does not count; a file that does not parse
(a newer Python, a template) falls back to patterns over its comment-stripped lines.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePath

from gpufleet.spec import JobSpec
from gpufleet.vocab import ACCELERATE_STRATEGIES


class Setup(StrEnum):
    """A distributed-setup call a script can make."""

    PREPARE = "gpufleet.train.prepare"
    DEEPSPEED = "deepspeed.initialize"
    ACCELERATOR = "Accelerator"
    PROCESS_GROUP = "init_process_group"
    DEVICE_MESH = "init_device_mesh"
    FSDP = "FSDP"  # fully_shard (FSDP2), FSDP / FullyShardedDataParallel (FSDP1)
    DDP = "DDP"  # DistributedDataParallel


class Applied(StrEnum):
    """What a warning is about: the layout flags, or the framework's own config."""

    LAYOUT = "layout"
    FRAMEWORK = "framework"


@dataclass(frozen=True)
class ScriptScan:
    calls: frozenset[Setup]
    parsed: bool  # False: the patterns of the fallback, not the syntax tree, found `calls`


@dataclass(frozen=True)
class ScriptWarning:
    about: Applied
    message: str


# A call's last name -> what it sets up (prepare and initialize are matched with their module).
_BY_NAME = {"Accelerator": Setup.ACCELERATOR, "init_process_group": Setup.PROCESS_GROUP,
            "init_device_mesh": Setup.DEVICE_MESH, "fully_shard": Setup.FSDP,
            "FSDP": Setup.FSDP, "FullyShardedDataParallel": Setup.FSDP,
            "DistributedDataParallel": Setup.DDP, "DDP": Setup.DDP}
_PATTERNS = {
    Setup.PREPARE: r"\btrain\s*\.\s*prepare\s*\(|from\s+gpufleet\.train\s+import\s[^\n]*\bprepare\b",
    Setup.DEEPSPEED: r"\bdeepspeed\s*\.\s*initialize\s*\(",
    Setup.ACCELERATOR: r"\bAccelerator\s*\(",
    Setup.PROCESS_GROUP: r"\binit_process_group\s*\(|\btrain\s*\.\s*setup\s*\(",
    Setup.DEVICE_MESH: r"\binit_device_mesh\s*\(",
    Setup.FSDP: r"\b(fully_shard|FSDP|FullyShardedDataParallel)\s*\(",
    Setup.DDP: r"\b(DistributedDataParallel|DDP)\s*\(",
}


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted name it was imported as (`import gpufleet.train as gt`,
    `from gpufleet.train import prepare as p`), so an aliased call still names its module."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(func: ast.expr) -> list[str]:
    """`a.b.c(...)` -> ["a", "b", "c"]; a call on anything but names (`f()()`) -> its last name."""
    parts: list[str] = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return parts[::-1]


def _classify(parts: list[str], aliases: dict[str, str]) -> Setup | None:
    if not parts:
        return None
    full = [*aliases.get(parts[0], parts[0]).split("."), *parts[1:]]
    if full[-1] == "prepare" and len(full) >= 2 and full[-2] == "train":
        return Setup.PREPARE  # gpufleet.train.prepare / train.prepare, not accelerator.prepare
    if full[-1] == "setup" and len(full) >= 2 and full[-2] == "train":
        return Setup.PROCESS_GROUP  # gpufleet.train.setup() joins the job's group, nothing more
    if full[-1] == "initialize" and "deepspeed" in full[:-1]:
        return Setup.DEEPSPEED
    return _BY_NAME.get(full[-1])


def _fallback(source: str) -> frozenset[Setup]:
    code = "\n".join(line.split("#", 1)[0] for line in source.splitlines())
    return frozenset(s for s, pattern in _PATTERNS.items() if re.search(pattern, code))


def scan(source: str) -> ScriptScan:
    """The distributed-setup calls in a script's text."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # ValueError: a NUL byte in the text
        return ScriptScan(_fallback(source), parsed=False)
    aliases = _aliases(tree)
    found = {_classify(_dotted(n.func), aliases) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return ScriptScan(frozenset(s for s in found if s is not None), parsed=True)


def own_setup(found: ScriptScan) -> str:
    """What a script that gpufleet does not lay out runs as, in a few words."""
    for setup, words in ((Setup.DEEPSPEED, "its own deepspeed.initialize"),
                         (Setup.ACCELERATOR, "its own Accelerator"),
                         (Setup.FSDP, "its own FSDP"), (Setup.DEVICE_MESH, "its own device mesh"),
                         (Setup.DDP, "its own DDP"), (Setup.PROCESS_GROUP, "its own process group")):
        if setup in found.calls:
            return words
    return "no distributed setup found: each rank may train alone"


def _layout_flags(spec: JobSpec) -> list[str]:
    """The flags of the spec that ask for more than plain replicated fp32 training."""
    flags = [f"--strategy {spec.strategy}"] if spec.strategy != "ddp" else []
    flags += [f"--{dim} {value}" for dim, value in (("tp", spec.tp), ("pp", spec.pp))
              if value is not None and value > 1]
    if flags and spec.dp is not None:
        flags.append(f"--dp {spec.dp}")
    if spec.microbatches is not None:
        flags.append(f"--microbatches {spec.microbatches}")
    if spec.precision != "fp32":
        flags.append(f"--precision {spec.precision}")
    return flags


def _accelerate_applies(spec: JobSpec) -> bool:
    """Whether Accelerate's generated config carries the whole layout (see
    frameworks.accelerate_config: FSDP2 or DDP, mixed precision; no tp/pp mesh, no ZeRO-1)."""
    meshed = (spec.tp or 1) > 1 or (spec.pp or 1) > 1 or spec.strategy in ("tp", "pp")
    return not meshed and spec.strategy in ACCELERATE_STRATEGIES


def warnings(found: ScriptScan, spec: JobSpec) -> list[ScriptWarning]:
    """What the user should hear before the start: layout flags or a framework the script will
    not use. Warnings only: the job still runs, as written."""
    name = PurePath(spec.script).name
    calls = found.calls
    out: list[ScriptWarning] = []
    flags = _layout_flags(spec)
    by_accelerate = (spec.framework == "accelerate" and Setup.ACCELERATOR in calls
                     and _accelerate_applies(spec))
    if flags and Setup.PREPARE not in calls and not by_accelerate:
        verb = "is" if len(flags) == 1 else "are"
        out.append(ScriptWarning(Applied.LAYOUT, (
            f"{' '.join(flags)} {verb} applied by gpufleet.train.prepare, which {name} does not "
            f"call: the script runs as written ({own_setup(found)})")))
    if spec.framework == "deepspeed" and not calls & {Setup.PREPARE, Setup.DEEPSPEED}:
        out.append(ScriptWarning(Applied.FRAMEWORK, (
            f"--framework deepspeed hands the model to deepspeed.initialize through "
            f"gpufleet.train.prepare; {name} calls neither, so ds_config.json is not used: the "
            f"script runs as written ({own_setup(found)})")))
    if spec.framework == "accelerate" and Setup.ACCELERATOR not in calls:
        after = ("gpufleet.train.prepare applies the layout" if Setup.PREPARE in calls
                 else f"the script runs as written ({own_setup(found)})")
        out.append(ScriptWarning(Applied.FRAMEWORK, (
            f"--framework accelerate configures Accelerator(), which {name} does not create, "
            f"so accelerate.yaml is not used: {after}")))
    return out


def script_warnings(spec: JobSpec, source: str | None) -> list[ScriptWarning]:
    """`warnings` for the script's text; none for a script that could not be read."""
    return [] if source is None else warnings(scan(source), spec)


def imports_gpufleet(source: str) -> bool:
    """Whether the script imports gpufleet (so it reports through the SDK, bootstrap or not)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return re.search(r"^\s*(?:from|import)\s+gpufleet\b", source, re.MULTILINE) is not None
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "gpufleet"
                                                for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gpufleet":
            return True
    return False
