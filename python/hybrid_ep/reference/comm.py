"""Collectives of the reference engine: padded all-gathers of tensors of any dtype.

Data travels as raw bytes (``uint8`` views), so BF16 and FP8 move bit-exactly over any
backend; gloo groups carry CPU tensors, NCCL groups CUDA tensors. Each all-gather waits at most
the group's ``timeout_s`` (``HYBRID_EP_TIMEOUT_S``): a peer that stops in the middle of a call
makes it raise HybridEPTimeoutError instead of blocking until the process group's own timeout.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import HybridEPTimeoutError


@dataclass
class CallGroup:
    """The process group of the engine's calls, the bound of each wait, and the operation under
    way (for the error)."""

    group: object
    timeout_s: float = 30.0
    op: str = "a call"


def _raw(group):
    return group.group if isinstance(group, CallGroup) else group


def _comm_device(group) -> torch.device:
    if dist.get_backend(_raw(group)) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_gather(out: list, tensor: torch.Tensor, group) -> None:
    if not isinstance(group, CallGroup):
        dist.all_gather(out, tensor, group=group)
        return
    opts = torch._C._distributed_c10d.AllgatherOptions()
    opts.timeout = datetime.timedelta(seconds=group.timeout_s)
    pg = group.group if group.group is not None else dist.group.WORLD
    try:
        pg.allgather([out], [tensor], opts).wait()
    except RuntimeError as error:  # after the call's agreement: a peer failed mid-call
        raise HybridEPTimeoutError(
            f"rank {dist.get_rank(pg)}: {group.op}: a peer stopped answering in the middle of "
            f"the call (it died, or sent nothing for {group.timeout_s:g} s, "
            f"HYBRID_EP_TIMEOUT_S): {str(error).splitlines()[0][:200]}; this buffer cannot be "
            "used any more") from error


def all_gather_ints(values: list[int], group) -> torch.Tensor:
    """[len(values)] ints of every rank -> int64 [W, len(values)] on the CPU."""
    device = _comm_device(group)
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size(_raw(group)))]
    _all_gather(out, mine, group)
    return torch.stack(out).cpu()


def all_gather_rows(tensor: torch.Tensor, rows: int, group) -> torch.Tensor:
    """Each rank's ``tensor`` (<= ``rows`` rows) zero-padded to ``rows`` -> [W, rows, ...].

    The result lives on ``tensor``'s device with ``tensor``'s dtype.
    """
    assert tensor.shape[0] <= rows, (tensor.shape, rows)
    device = _comm_device(group)
    row_shape = tensor.shape[1:]
    row_bytes = _row_bytes(tensor)
    as_bytes = tensor.contiguous().view(torch.uint8).reshape(tensor.shape[0], row_bytes)
    padded = torch.zeros(rows, row_bytes, dtype=torch.uint8, device=device)
    padded[: tensor.shape[0]] = as_bytes.to(device)
    out = [torch.empty_like(padded) for _ in range(dist.get_world_size(_raw(group)))]
    _all_gather(out, padded, group)
    stacked = torch.stack(out).to(tensor.device)
    return stacked.view(tensor.dtype).reshape(len(out), rows, *row_shape)


def _row_bytes(tensor: torch.Tensor) -> int:
    numel = 1
    for size in tensor.shape[1:]:
        numel *= size
    return numel * tensor.element_size()
