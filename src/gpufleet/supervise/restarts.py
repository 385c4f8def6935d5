"""Whether to restart a failed worker group, and after how long. Pure: failures in, a decision out.

A restart costs the steps since the last checkpoint, so it is worth trying a few times; a job
that fails the same way again and again without ever saving a newer checkpoint (a bug, a bad
config, an input that always crashes step 1,234) only burns money, so it stops with the reason.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

SAME_FAILURE_LIMIT = 3  # identical failures in a row, with no new checkpoint, that end the job
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 30.0


@dataclass(frozen=True)
class Failure:
    """One worker-group failure: what happened, and how far training had got."""

    signature: str  # what makes two failures "the same way"
    description: str  # for people: which rank, exit code or signal, the error line
    step: int | None  # the last step reported before it
    checkpoint_step: int | None  # the newest checkpoint saved before it


@dataclass(frozen=True)
class Decision:
    restart: bool
    delay_s: float
    reason: str


def describe_exit(code: int | None) -> str:
    """'exit code 1', or 'killed by SIGKILL' for a negative code or a 128+N shell-style code."""
    if code is None:
        return "no exit code"
    num = -code if code < 0 else code - 128 if 128 < code < 160 else None
    if num is not None:
        try:
            return f"killed by {signal.Signals(num).name}"
        except ValueError:
            pass
    return f"exit code {code}"


def signature(rank: int | None, exit_text: str, error: str | None) -> str:
    """Failures with the same error (or, without one, the same exit) on the same rank match."""
    return f"rank {rank}: {error}" if error else f"rank {rank}: {exit_text}"


def backoff_s(consecutive: int, base_s: float = BACKOFF_BASE_S, cap_s: float = BACKOFF_CAP_S) -> float:
    """At once after a first failure (most are one-off: a killed worker, a lost node), then
    1 s, 2 s, 4 s ... up to 30 s, counted over failures since the last new checkpoint."""
    if consecutive <= 1:
        return 0.0
    return float(min(cap_s, base_s * 2.0 ** (consecutive - 2)))


def consecutive(failures: list[Failure]) -> int:
    """Failures at the end of the list that share one checkpoint (no progress between them)."""
    if not failures:
        return 0
    last = failures[-1].checkpoint_step
    n = 0
    for f in reversed(failures):
        if f.checkpoint_step != last:
            break
        n += 1
    return n


def decide(failures: list[Failure], max_restarts: int,
           same_limit: int = SAME_FAILURE_LIMIT) -> Decision:
    """After the latest failure (the last of `failures`, the job's whole history)."""
    latest = failures[-1]
    if max_restarts == 0:
        return Decision(False, 0.0, f"{latest.description} (restarts are off: --max-restarts 0)")
    if len(failures) > max_restarts:
        return Decision(False, 0.0, f"{latest.description}; gave up after {max_restarts} "
                        f"restart(s) (--max-restarts {max_restarts})")
    run = consecutive(failures)
    tail = failures[-same_limit:]
    if len(tail) == same_limit and run >= same_limit and \
            len({f.signature for f in tail}) == 1:
        where = (f"from gpufleet's checkpoint at step {latest.checkpoint_step} with no newer "
                 "one" if latest.checkpoint_step else "with no checkpoint of gpufleet's")
        return Decision(False, 0.0, f"failed {same_limit} times in a row the same way, each time "
                        f"{where}: {latest.description}; not restarting again (fix the cause, "
                        "then gpufleet run --resume)")
    return Decision(True, backoff_s(run), f"restart {len(failures)} of {max_restarts}")


def resumes_from(failure: Failure, has_checkpointer: bool = False) -> str:
    """What a restart resumes from, as gpufleet knows it. Without a checkpoint of gpufleet's
    (`train.Checkpointer`), the script starts again as written: it may well resume from
    checkpoints of its own (the DDP tutorial's snapshot), so gpufleet neither says "from the
    start" nor counts steps redone then."""
    if not failure.checkpoint_step and has_checkpointer:  # gpufleet's checkpoints, none yet
        return "from the start (no checkpoint yet)"
    if not failure.checkpoint_step:
        return ("gpufleet holds no checkpoint: the script restarts as written (it may resume "
                "from its own checkpoints)")
    lost = steps_lost(failure)
    return (f"from gpufleet's checkpoint at step {failure.checkpoint_step}"
            + (f"; {lost} step(s) are redone" if lost is not None else ""))


def resumes_after_loss(failure: Failure, copied: int | None, durable: bool,
                       has_checkpointer: bool = False) -> str:
    """What a restart after a lost node resumes from. The lost node's checkpoints went with
    it, and its replacement has only what reached `--checkpoint-to`; the ranks load the
    newest checkpoint every one of them can read (`train.Checkpointer.resume`). So the
    restart names the newest copy (`copied`), not the newest checkpoint saved: a copy still
    in flight, or a lost node that comes back with its disk, can only make it newer."""
    saved = failure.checkpoint_step
    if not saved and not copied:
        return resumes_from(failure, has_checkpointer)
    if copied:
        lost = None if failure.step is None else max(0, failure.step - copied)
        newer = "" if saved is not None and saved <= copied else \
            " (a newer one only if every node still has it)"
        return (f"from gpufleet's checkpoint at step {copied}, the newest copied to "
                f"--checkpoint-to{newer}" + (f"; up to {lost} step(s) are redone"
                                             if lost is not None else ""))
    why = ("none has been copied to --checkpoint-to yet" if durable else
           "without --checkpoint-to, a lost node's checkpoints are gone with it")
    return (f"from gpufleet's checkpoint at step {saved} only if every node still has it, "
            f"else from the start ({why})")


def steps_lost(failure: Failure) -> int | None:
    """Steps done since the checkpoint the restart resumes from (all of them without one)."""
    if failure.step is None:
        return None
    return max(0, failure.step - (failure.checkpoint_step or 0))
