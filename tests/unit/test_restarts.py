"""supervise.restarts: when a failed worker group is restarted, after how long, and when not."""

from __future__ import annotations

import pytest

from gpufleet.supervise.restarts import (
    BACKOFF_CAP_S,
    Failure,
    backoff_s,
    consecutive,
    decide,
    describe_exit,
    signature,
    steps_lost,
)

SIG = "rank 0: exit code 1"


def fail(sig: str = SIG, checkpoint: int | None = None, step: int | None = 10,
         description: str = "rank 0 exited with exit code 1") -> Failure:
    return Failure(signature=sig, description=description, step=step, checkpoint_step=checkpoint)


# ---------------------------------------------------------------- describe_exit / signature


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (-9, "killed by SIGKILL"),
        (137, "killed by SIGKILL"),
        (-15, "killed by SIGTERM"),
        (143, "killed by SIGTERM"),
        (1, "exit code 1"),
        (0, "exit code 0"),
        (128, "exit code 128"),  # not 128+N for a signal N >= 1
        (None, "no exit code"),
    ],
)
def test_describe_exit(code: int | None, text: str) -> None:
    assert describe_exit(code) == text


def test_describe_exit_unknown_signal_number_falls_back_to_the_code() -> None:
    assert describe_exit(-99) == "exit code -99"


def test_signature_prefers_the_error_line_over_the_exit() -> None:
    assert signature(3, "exit code 1", "RuntimeError: boom") == "rank 3: RuntimeError: boom"
    assert signature(3, "exit code 1", None) == "rank 3: exit code 1"
    assert signature(None, "killed by SIGKILL", "") == "rank None: killed by SIGKILL"
    assert signature(0, "exit code 1", "E") != signature(1, "exit code 1", "E")


# ---------------------------------------------------------------- backoff / consecutive


def test_backoff_is_immediate_first_then_doubles_from_one_second_and_caps_at_thirty() -> None:
    assert [backoff_s(n) for n in range(1, 9)] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff_s(0) == 0.0
    assert backoff_s(100) == BACKOFF_CAP_S == 30.0


def test_consecutive_counts_the_tail_sharing_the_latest_checkpoint() -> None:
    assert consecutive([]) == 0
    assert consecutive([fail(checkpoint=None)] * 3) == 3
    assert consecutive([fail(checkpoint=None), fail(checkpoint=100), fail(checkpoint=100)]) == 2
    assert consecutive([fail(checkpoint=100), fail(checkpoint=100), fail(checkpoint=200)]) == 1


# ---------------------------------------------------------------- decide


def test_max_restarts_zero_never_restarts() -> None:
    d = decide([fail()], max_restarts=0)
    assert not d.restart
    assert d.delay_s == 0.0
    assert "restarts are off" in d.reason
    assert "rank 0 exited with exit code 1" in d.reason


def test_restarts_up_to_max_then_gives_up() -> None:
    history = [fail(sig=f"rank 0: error {i}") for i in range(3)]
    for n in (1, 2):
        d = decide(history[:n], max_restarts=2)
        assert d.restart, d.reason
        assert d.reason == f"restart {n} of 2"
    d = decide(history, max_restarts=2)
    assert not d.restart
    assert "gave up after 2 restart(s)" in d.reason
    assert "--max-restarts 2" in d.reason


def test_three_identical_failures_from_the_same_checkpoint_stop() -> None:
    d = decide([fail(checkpoint=100)] * 3, max_restarts=10)
    assert not d.restart
    assert "the same way" in d.reason
    assert "from gpufleet's checkpoint at step 100 with no newer one" in d.reason


def test_three_identical_failures_without_any_checkpoint_say_gpufleet_holds_none() -> None:
    d = decide([fail(checkpoint=None)] * 3, max_restarts=10)
    assert not d.restart
    assert "the same way" in d.reason
    assert "with no checkpoint of gpufleet's" in d.reason and "from the start" not in d.reason


def test_two_identical_failures_still_restart() -> None:
    assert decide([fail(checkpoint=100)] * 2, max_restarts=10).restart


def test_identical_failures_with_a_newer_checkpoint_between_restart() -> None:
    """Progress between failures means the job is getting somewhere: keep going."""
    for checkpoints in ([100, 200, 200], [100, 100, 200], [None, 100, 200]):
        d = decide([fail(checkpoint=c) for c in checkpoints], max_restarts=10)
        assert d.restart, (checkpoints, d.reason)


def test_different_failures_from_the_same_checkpoint_restart() -> None:
    history = [fail(sig="rank 0: A"), fail(sig="rank 1: B"), fail(sig="rank 0: A")]
    d = decide(history, max_restarts=10)
    assert d.restart
    assert d.delay_s == 2.0  # the third failure since that checkpoint: 0, 1, then 2 s


def test_same_way_run_after_an_earlier_different_failure_stops() -> None:
    history = [fail(sig="rank 1: other")] + [fail()] * 3
    assert not decide(history, max_restarts=10).restart


def test_same_limit_is_configurable() -> None:
    assert not decide([fail()] * 2, max_restarts=10, same_limit=2).restart
    assert decide([fail()] * 4, max_restarts=10, same_limit=5).restart


def test_decide_backoff_grows_then_resets_after_a_new_checkpoint() -> None:
    history: list[Failure] = []
    delays = []
    for i in range(8):
        history.append(fail(sig=f"rank 0: error {i}", checkpoint=50))
        d = decide(history, max_restarts=20)
        assert d.restart
        delays.append(d.delay_s)
    assert delays == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    history.append(fail(sig="rank 0: error x", checkpoint=60))
    assert decide(history, max_restarts=20).delay_s == 0.0
    history.append(fail(sig="rank 0: error y", checkpoint=60))
    assert decide(history, max_restarts=20).delay_s == 1.0


# ---------------------------------------------------------------- steps_lost


def test_steps_lost_since_the_checkpoint() -> None:
    assert steps_lost(fail(step=130, checkpoint=100)) == 30
    assert steps_lost(fail(step=100, checkpoint=100)) == 0


def test_steps_lost_without_a_checkpoint_is_every_step() -> None:
    assert steps_lost(fail(step=42, checkpoint=None)) == 42


def test_steps_lost_unknown_step_and_never_negative() -> None:
    assert steps_lost(fail(step=None, checkpoint=100)) is None
    assert steps_lost(fail(step=90, checkpoint=100)) == 0


def test_a_checkpointer_script_without_a_checkpoint_yet_restarts_from_the_start() -> None:
    from gpufleet.supervise.restarts import Failure, resumes_from

    none_yet = Failure(signature="s", description="d", step=5, checkpoint_step=None)
    assert resumes_from(none_yet, has_checkpointer=True) == "from the start (no checkpoint yet)"
    assert "restarts as written" in resumes_from(none_yet)


def test_after_a_lost_node_the_restart_names_the_newest_copy_not_the_newest_save() -> None:
    from gpufleet.supervise.restarts import resumes_after_loss

    # saved at 10 on the nodes, copied up to 8: the replacement can read only the copy
    said = resumes_after_loss(fail(step=11, checkpoint=10), copied=8, durable=True,
                              has_checkpointer=True)
    assert said == ("from gpufleet's checkpoint at step 8, the newest copied to --checkpoint-to "
                    "(a newer one only if every node still has it); up to 3 step(s) are redone")
    caught_up = resumes_after_loss(fail(step=11, checkpoint=10), copied=10, durable=True)
    assert caught_up == ("from gpufleet's checkpoint at step 10, the newest copied to "
                         "--checkpoint-to; up to 1 step(s) are redone")


def test_after_a_lost_node_with_nothing_copied_the_start_is_said_as_possible() -> None:
    from gpufleet.supervise.restarts import resumes_after_loss

    pending = resumes_after_loss(fail(step=11, checkpoint=10), copied=None, durable=True)
    assert pending == ("from gpufleet's checkpoint at step 10 only if every node still has it, "
                       "else from the start (none has been copied to --checkpoint-to yet)")
    assert "without --checkpoint-to, a lost node's checkpoints are gone with it" in \
        resumes_after_loss(fail(step=11, checkpoint=10), copied=None, durable=False)
    # nothing saved at all reads as any other restart
    assert resumes_after_loss(fail(step=5, checkpoint=None), None, True, has_checkpointer=True) \
        == "from the start (no checkpoint yet)"
