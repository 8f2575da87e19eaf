"""Collectives of the reference engine: padded all-gathers of tensors of any dtype.

Data travels as raw bytes (``uint8`` views), so BF16 and FP8 move bit-exactly over any
backend; gloo groups carry CPU tensors, NCCL groups CUDA tensors.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _comm_device(group) -> torch.device:
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_ints(values: list[int], group) -> torch.Tensor:
    """[len(values)] ints of every rank -> int64 [W, len(values)] on the CPU."""
    device = _comm_device(group)
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, mine, group=group)
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
    out = [torch.empty_like(padded) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, padded, group=group)
    stacked = torch.stack(out).to(tensor.device)
    return stacked.view(tensor.dtype).reshape(len(out), rows, *row_shape)


def _row_bytes(tensor: torch.Tensor) -> int:
    numel = 1
    for size in tensor.shape[1:]:
        numel *= size
    return numel * tensor.element_size()
