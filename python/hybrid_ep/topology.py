"""Rank -> (node_rank, local_rank): how the group splits into NVLink domains."""

from __future__ import annotations

import socket
from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class Topology:
    rank: int
    group_size: int
    ranks_per_domain: int

    @property
    def num_of_nodes(self) -> int:
        return self.group_size // self.ranks_per_domain

    @property
    def local_rank(self) -> int:
        return self.rank % self.ranks_per_domain

    @property
    def node_rank(self) -> int:
        return self.rank // self.ranks_per_domain

    def peer(self, node: int) -> int:
        """The rank with this rank's local rank in domain ``node``."""
        return node * self.ranks_per_domain + self.local_rank


def check_ranks_per_domain(value: int, group_size: int, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{source}={value!r}: expected an int")
    if value < 1 or group_size % value != 0:
        raise ValueError(f"{source}={value}: expected a positive divisor of the group size "
                         f"{group_size}")
    return value


def detect_ranks_per_domain(hostnames: list[str], use_mnnvl: bool) -> int:
    """Ranks on one host share an NVLink domain; with MNNVL the whole group is one domain.

    Hosts must hold equal, contiguous blocks of ranks; otherwise the split is ambiguous and
    the user has to say it.
    """
    group_size = len(hostnames)
    if use_mnnvl:
        return group_size
    per_host = hostnames.count(hostnames[0])
    blocks_ok = group_size % per_host == 0 and all(
        len(set(hostnames[i:i + per_host])) == 1 for i in range(0, group_size, per_host))
    if not blocks_ok or len(set(hostnames)) != group_size // per_host:
        raise ValueError(
            "cannot detect the NVLink domains: ranks are not spread over hosts in equal "
            f"contiguous blocks ({hostnames}); set NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN")
    return per_host


def local_facts() -> dict:
    return {"host": socket.gethostname()}


def gather_objects(obj, group) -> list:
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out
