"""The loader `prepare` returns: each data-parallel rank's share of the data, in an order that can
resume mid-epoch at any world size.

Position is kept in *global* samples (how far into this epoch's order the whole job has read),
not in batches of one rank. The order is a permutation seeded by (seed + epoch), the same one
`DistributedSampler` uses, and rank r of n reads every n-th index of it from the position on. So
a checkpoint taken on 2 ranks and loaded on 1 (or 4) continues with exactly the samples the job
had not read yet: together with gradient accumulation, each optimizer step sees the same global
batch whatever the world size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, Sampler

from gpufleet.train import telemetry


class ResumableSampler(Sampler[int]):  # type: ignore[misc]
    """DistributedSampler's order, starting `offset` global samples into the epoch."""

    def __init__(self, size: int, replicas: int, rank: int, *, shuffle: bool, seed: int,
                 drop_last: bool) -> None:
        self.size, self.replicas, self.rank = size, replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        self.offset = 0

    def order(self, epoch: int) -> list[int]:
        """The whole job's order for one epoch, trimmed (drop_last) or padded to a multiple of
        the replicas as DistributedSampler does."""
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed + epoch)
            indices: list[int] = torch.randperm(self.size, generator=gen).tolist()
        else:
            indices = list(range(self.size))
        if self.drop_last:
            return indices[: self.size - self.size % self.replicas]
        pad = -self.size % self.replicas
        while pad > 0 and indices:
            indices += indices[:pad]
            pad = -len(indices) % self.replicas
        return indices

    def global_len(self, epoch: int) -> int:
        return len(self.order(epoch))

    def rest(self) -> list[int]:
        """What the job has left to read in this epoch, trimmed or padded (wrapping around, as
        DistributedSampler pads) so every rank gets as many samples as the others."""
        order = self.order(self.epoch)
        rest = order[self.offset:]
        if self.drop_last:
            return rest[: len(rest) - len(rest) % self.replicas]
        pad = -len(rest) % self.replicas
        while pad > 0 and order:
            rest += order[:pad]
            pad = -len(rest) % self.replicas
        return rest

    def __iter__(self) -> Iterator[int]:
        return iter(self.rest()[self.rank :: self.replicas])

    def __len__(self) -> int:
        return len(self.rest()) // self.replicas


class ResumableLoader(DataLoader):  # type: ignore[type-arg,misc]
    """A DataLoader that moves to the next epoch on each new pass and knows how far the job has
    read, as `state_dict()`, for checkpoints."""

    def __init__(self, *args: Any, replicas: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replicas = replicas
        self._next = (0, 0)  # (epoch, global offset) the next pass starts at
        self._position = (0, 0)  # where the job is now

    def __iter__(self) -> Iterator[Any]:
        sampler = self.sampler
        epoch, offset = self._next
        self._next = (epoch + 1, 0)
        self._position = (epoch, offset)
        if isinstance(sampler, ResumableSampler):
            sampler.epoch, sampler.offset = epoch, offset
        it: Iterator[Any] = super().__iter__()
        if telemetry.ENABLED:
            it = telemetry.timed_batches(it)
        return self._counted(it, epoch, offset)

    def _counted(self, it: Iterator[Any], epoch: int, offset: int) -> Iterator[Any]:
        per_batch = (self.batch_size or 1) * self.replicas
        for read, batch in enumerate(it, 1):
            self._position = (epoch, offset + read * per_batch)
            yield batch

    def state_dict(self) -> dict[str, int]:
        """Where the job is in its data: the epoch and the global samples read in it."""
        epoch, offset = self._position
        return {"epoch": epoch, "offset": offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from `state` on the next pass (start a new iterator after loading). A
        position with no full batch left for this loader moves to the start of the next
        epoch, as the original run's next pass would have."""
        epoch, offset = int(state["epoch"]), int(state["offset"])
        sampler = self.sampler
        if isinstance(sampler, ResumableSampler):
            left = (sampler.global_len(epoch) - offset) // self.replicas
            if left <= 0 or (self.drop_last and left < (self.batch_size or 1)):
                epoch, offset = epoch + 1, 0
        self._next = self._position = (epoch, offset)


def shard_loader(loader: DataLoader[Any], replicas: int, rank: int) -> DataLoader[Any]:
    """The loader over this data-parallel rank's share: tensor and pipeline ranks of one replica
    read the same batches. Shuffled stays shuffled (seeded by the loader's generator, or kept
    from a DistributedSampler it already had); every other option carries over."""
    from torch.utils.data import IterableDataset, SequentialSampler

    if isinstance(loader.dataset, IterableDataset):
        raise ValueError("prepare() shards map-style datasets; an IterableDataset must split its "
                         "stream by rank itself (pass loader=None)")
    sampler = loader.sampler
    if loader.batch_size is None:
        raise ValueError("prepare() cannot shard a DataLoader built with batch_sampler=; give it "
                         "batch_size= or shard it yourself (pass loader=None)")
    if isinstance(sampler, DistributedSampler):
        shuffle, seed = sampler.shuffle, sampler.seed
    elif isinstance(sampler, RandomSampler | SequentialSampler):
        shuffle = isinstance(sampler, RandomSampler)
        seed = int(loader.generator.initial_seed()) if shuffle and loader.generator is not None else 0
    else:
        raise ValueError(f"prepare() cannot shard a DataLoader with a {type(sampler).__name__}; "
                         "use shuffle=True/False or a DistributedSampler, or pass loader=None")
    new_sampler = ResumableSampler(len(loader.dataset), replicas, rank,  # type: ignore[arg-type]
                                   shuffle=shuffle, seed=seed, drop_last=loader.drop_last)
    extra: dict[str, Any] = {}
    if loader.num_workers > 0:
        extra = {"prefetch_factor": loader.prefetch_factor,
                 "persistent_workers": loader.persistent_workers,
                 "multiprocessing_context": loader.multiprocessing_context}
    return ResumableLoader(loader.dataset, batch_size=loader.batch_size, sampler=new_sampler,
                           num_workers=loader.num_workers, collate_fn=loader.collate_fn,
                           pin_memory=loader.pin_memory, drop_last=loader.drop_last,
                           timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
                           generator=loader.generator, replicas=replicas, **extra)
