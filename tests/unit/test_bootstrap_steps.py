"""The worker bootstrap's step counting and batch sizes, with a fake clock and sender."""

from __future__ import annotations

from gpufleet.bootstrap.steps import MIN_INTERVAL_S, Steps, batch_size


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def counter(world: int = 1) -> tuple[Steps, list[tuple[int, int | None]], Clock]:
    sent: list[tuple[int, int | None]] = []
    clock = Clock()
    return Steps(send=lambda step, samples: sent.append((step, samples)), clock=clock,
                 world_size=world), sent, clock


def test_each_step_is_reported_with_the_global_samples_since_the_last() -> None:
    steps, sent, clock = counter(world=2)
    opt = object()
    for _ in range(3):
        steps.batch(8)
        steps.stepped(opt)
        clock.t += 1.0
    assert sent == [(1, 16), (2, 16), (3, 16)]


def test_gradient_accumulation_counts_every_micro_batch_in_the_step() -> None:
    steps, sent, _ = counter(world=2)
    for _ in range(4):
        steps.batch(8)
    steps.stepped(object())
    assert sent == [(1, 64)]


def test_no_dataloader_means_no_samples_not_zero() -> None:
    steps, sent, clock = counter()
    opt = object()
    steps.stepped(opt)
    clock.t += 1
    steps.stepped(opt)
    assert sent == [(1, None), (2, None)]


def test_only_the_first_optimizer_that_steps_is_counted() -> None:
    steps, sent, clock = counter()
    gen, disc = object(), object()
    for _ in range(3):
        steps.stepped(gen)
        steps.stepped(disc)
        clock.t += 1
    assert [s for s, _ in sent] == [1, 2, 3]


def test_fast_steps_are_reported_in_batches_and_the_samples_are_not_lost() -> None:
    steps, sent, clock = counter()
    opt = object()
    for _ in range(10):
        steps.batch(4)
        steps.stepped(opt)
        clock.t += MIN_INTERVAL_S / 4
    assert steps.step == 10
    assert len(sent) < 10
    assert sum(n or 0 for _, n in sent) + steps.pending_samples == 40


def test_it_stands_down_for_good_once_the_script_uses_the_sdk() -> None:
    used = {"sdk": False}
    steps, sent, clock = counter()
    steps.stand_down_if = lambda: used["sdk"]
    opt = object()
    steps.stepped(opt)
    used["sdk"] = True
    clock.t += 1
    steps.stepped(opt)
    used["sdk"] = False
    clock.t += 1
    steps.stepped(opt)
    assert sent == [(1, None)]


class Shaped:
    def __init__(self, *shape: int) -> None:
        self.shape = shape


def test_batch_size_finds_the_first_dimension_of_the_first_tensor() -> None:
    assert batch_size(Shaped(32, 3, 224, 224)) == 32
    assert batch_size((Shaped(16, 10), Shaped(16))) == 16
    assert batch_size({"input_ids": Shaped(4, 128), "labels": Shaped(4, 128)}) == 4
    assert batch_size([["text"], Shaped(2, 5)]) == 2
    assert batch_size(Shaped()) is None  # a scalar
    assert batch_size("a string") is None
    assert batch_size([[[[[Shaped(3)]]]]]) is None  # too deep to be a batch


def test_held_back_steps_are_flushed_at_exit() -> None:
    steps, sent, clock = counter()
    opt = object()
    for _ in range(5):
        steps.batch(2)
        steps.stepped(opt)
        clock.t += MIN_INTERVAL_S / 10
    steps.flush()
    assert sent[-1][0] == 5
    assert sum(n or 0 for _, n in sent) == 10
    steps.flush()  # nothing new: nothing sent
    assert sent[-1][0] == 5 and len(sent) == 2


def test_a_rebuilt_optimizer_is_followed_once_it_steps_twice_in_a_row() -> None:
    steps, sent, clock = counter()
    first, rebuilt = object(), object()
    for opt in (first, first, rebuilt, rebuilt, rebuilt):
        steps.stepped(opt)
        clock.t += 1
    assert [s for s, _ in sent] == [1, 2, 3, 4]  # the rebuilt one's 2nd step counts, then all


def test_the_samplers_replicas_not_the_world_size_multiply_the_batch() -> None:
    steps, sent, _ = counter(world=4)  # e.g. dp=2 x tp=2: two replicas of the data
    steps.batch(8, replicas=2)
    steps.stepped(object())
    assert sent == [(1, 16)]
