"""train.data: DistributedSampler's order, resumable mid-epoch at any world size."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from gpufleet.train.data import ResumableLoader, ResumableSampler, shard_loader

SIZE = 40
BATCH = 4


def sampler(size: int, replicas: int, rank: int, *, shuffle: bool = True, seed: int = 0,
            drop_last: bool = False, epoch: int = 0, offset: int = 0) -> ResumableSampler:
    s = ResumableSampler(size, replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
    s.epoch, s.offset = epoch, offset
    return s


def interleave(per_rank: list[list[int]]) -> list[int]:
    return [i for group in itertools.zip_longest(*per_rank) for i in group if i is not None]


# ---------------------------------------------------------------- ResumableSampler


@pytest.mark.parametrize(
    ("size", "replicas", "shuffle", "seed", "drop_last", "epoch"),
    [
        (20, 4, True, 0, False, 0),
        (23, 4, True, 0, False, 0),
        (23, 4, True, 0, True, 0),
        (23, 4, False, 0, False, 0),
        (23, 4, False, 0, True, 0),
        (17, 3, True, 42, False, 5),
        (17, 3, True, 42, True, 5),
        (3, 8, True, 1, False, 2),  # fewer samples than replicas: padded by repeating
        (3, 8, False, 1, False, 0),
        (1, 1, True, 9, False, 1),
    ],
)
def test_offset_zero_matches_distributed_sampler(size: int, replicas: int, shuffle: bool, seed: int,
                                                 drop_last: bool, epoch: int) -> None:
    data = list(range(size))
    for rank in range(replicas):
        ref = DistributedSampler(data, num_replicas=replicas, rank=rank, shuffle=shuffle, seed=seed,
                                 drop_last=drop_last)
        ref.set_epoch(epoch)
        ours = sampler(size, replicas, rank, shuffle=shuffle, seed=seed, drop_last=drop_last,
                       epoch=epoch)
        assert list(ours) == list(ref), rank
        assert len(ours) == len(ref), rank


def test_epochs_and_seeds_change_the_order() -> None:
    base = list(sampler(SIZE, 1, 0, seed=0, epoch=0))
    assert list(sampler(SIZE, 1, 0, seed=0, epoch=1)) != base
    assert list(sampler(SIZE, 1, 0, seed=1, epoch=0)) != base
    assert sorted(base) == list(range(SIZE))


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("offset", [0, 2, 3, 7, 10, 39, 40])
def test_position_is_in_global_samples(offset: int, drop_last: bool) -> None:
    """Two ranks reading from global offset K together read what one rank reads from K."""
    single = list(sampler(SIZE, 1, 0, seed=3, drop_last=drop_last, epoch=1, offset=offset))
    ranks = [list(sampler(SIZE, 2, r, seed=3, drop_last=drop_last, epoch=1, offset=offset))
             for r in range(2)]
    together = interleave(ranks)
    if offset % 2 and drop_last:
        single = single[:-1]  # an odd remainder: two ranks drop the last sample
    elif offset % 2:
        # ... or pad with the epoch's first sample, as DistributedSampler pads, so both ranks
        # read as many
        first = next(iter(sampler(SIZE, 1, 0, seed=3, drop_last=False, epoch=1)))
        assert together[-1] == first
        together = together[:-1]
    assert together == single


def test_offset_skips_a_prefix_of_the_epoch_order() -> None:
    full = list(sampler(SIZE, 1, 0, seed=5))
    assert list(sampler(SIZE, 1, 0, seed=5, offset=12)) == full[12:]
    assert list(sampler(SIZE, 1, 0, seed=5, offset=SIZE)) == []
    assert [len(sampler(SIZE, 2, r, seed=5, offset=12)) for r in range(2)] == [14, 14]
    assert len(sampler(SIZE, 1, 0, seed=5, offset=SIZE + 8)) == 0


def test_every_rank_reads_as_many_samples_from_any_offset() -> None:
    """A 1-rank position (offset 3) loaded on 2 ranks: DDP needs equal counts per rank."""
    ranks = [sampler(10, 2, r, shuffle=False, offset=3) for r in range(2)]
    assert [len(list(s)) for s in ranks] == [len(s) for s in ranks]
    assert len(list(ranks[0])) == len(list(ranks[1]))


# ---------------------------------------------------------------- ResumableLoader


def dataset(size: int = SIZE) -> TensorDataset:
    return TensorDataset(torch.arange(size), torch.arange(size) * 10)


def make_loader(replicas: int = 1, rank: int = 0, seed: int = 1234, size: int = SIZE,
                batch: int = BATCH) -> ResumableLoader:
    plain = DataLoader(dataset(size), batch_size=batch, shuffle=True,
                       generator=torch.Generator().manual_seed(seed), drop_last=True)
    loader = shard_loader(plain, replicas, rank)
    assert isinstance(loader, ResumableLoader)
    return loader


def ids(batches: list[list[torch.Tensor]]) -> list[list[int]]:
    return [b[0].tolist() for b in batches]


def flat(batches: list[list[int]]) -> list[int]:
    return [i for batch in batches for i in batch]


def test_shard_loader_keeps_the_options_and_shuffles_by_the_generator_seed() -> None:
    loader = make_loader(replicas=2, rank=1)
    assert (loader.batch_size, loader.drop_last, loader.replicas) == (BATCH, True, 2)
    s = loader.sampler
    assert isinstance(s, ResumableSampler)
    assert (s.replicas, s.rank, s.shuffle, s.seed, s.drop_last) == (2, 1, True, 1234, True)
    first = ids(list(loader))
    assert first == ids(list(make_loader(replicas=2, rank=1)))  # deterministic
    assert first != ids(list(make_loader(replicas=2, rank=1, seed=99)))


def test_each_pass_is_the_next_epoch() -> None:
    loader = make_loader()
    epoch0, epoch1 = ids(list(loader)), ids(list(loader))
    assert epoch0 != epoch1
    assert flat(epoch0) == list(sampler(SIZE, 1, 0, seed=1234, drop_last=True, epoch=0))
    assert flat(epoch1) == list(sampler(SIZE, 1, 0, seed=1234, drop_last=True, epoch=1))
    assert loader.state_dict() == {"epoch": 1, "offset": SIZE}


def test_state_dict_counts_global_samples() -> None:
    loader = make_loader(replicas=2)
    it = iter(loader)
    assert loader.state_dict() == {"epoch": 0, "offset": 0}
    next(it), next(it)
    assert loader.state_dict() == {"epoch": 0, "offset": 2 * BATCH * 2}


def test_resume_mid_epoch_continues_with_the_same_batches() -> None:
    first = make_loader()
    it = iter(first)
    _ = [next(it) for _ in range(3)]
    state = first.state_dict()
    expected = ids(list(it))
    fresh = make_loader()
    fresh.load_state_dict(state)
    assert ids(list(fresh)) == expected
    assert len(expected) == SIZE // BATCH - 3


def test_resume_in_a_later_epoch() -> None:
    first = make_loader()
    list(first)  # epoch 0 done: the next pass starts epoch 1 at offset 0
    it = iter(first)
    assert first.state_dict() == {"epoch": 1, "offset": 0}
    next(it), next(it)
    state = first.state_dict()
    assert state == {"epoch": 1, "offset": 2 * BATCH}
    rest_of_epoch1 = ids(list(it))
    epoch2 = ids(list(first))

    fresh = make_loader()
    fresh.load_state_dict(state)
    assert ids(list(fresh)) == rest_of_epoch1
    assert ids(list(fresh)) == epoch2


def test_resume_from_the_end_of_an_epoch_starts_the_next_epoch() -> None:
    first = make_loader()
    list(first)
    state = first.state_dict()
    expected = ids(list(first))  # what the job reads next: epoch 1
    fresh = make_loader()
    fresh.load_state_dict(state)
    assert ids(list(fresh)) == expected


def test_two_replica_position_continues_on_one_replica() -> None:
    two = [make_loader(replicas=2, rank=r) for r in range(2)]
    its = [iter(x) for x in two]
    for _ in range(2):
        for it in its:
            next(it)
    state = two[0].state_dict()
    assert state == two[1].state_dict() == {"epoch": 0, "offset": 2 * BATCH * 2}
    remaining = interleave([flat(ids(list(it))) for it in its])

    one = make_loader(replicas=1)
    one.load_state_dict(state)
    got = flat(ids(list(one)))
    assert got == remaining
    assert len(got) == len(set(got))  # no sample twice
    read_before = set(flat(ids(list(make_loader(replicas=1))[:4])))
    assert read_before.isdisjoint(got)
    assert read_before | set(got) == set(range(SIZE))


def test_loaded_state_is_reported_before_the_next_pass() -> None:
    loader = make_loader()
    loader.load_state_dict({"epoch": 3, "offset": 8})
    assert loader.state_dict() == {"epoch": 3, "offset": 8}
    next(iter(loader))
    assert loader.state_dict() == {"epoch": 3, "offset": 8 + BATCH}
