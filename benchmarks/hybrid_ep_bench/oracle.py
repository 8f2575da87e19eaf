"""An independent check of dispatch and combine for the bench: gather everything, select directly.

Deliberately unlike the engines: no handle, no staging, no padding tricks; every rank's inputs
are gathered as Python objects and each expected row is picked by a plain boolean mask.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def gather_inputs(group, **tensors) -> list[dict]:
    mine = {k: (t.cpu() if t is not None else None) for k, t in tensors.items()}
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    return everyone


def expected_dispatch(everyone: list[dict], rank: int, experts: int, ranks_per_domain: int):
    """Rows of this rank: sources ascending, tokens ascending, wherever one expert is local."""
    node_width = experts * ranks_per_domain
    node = rank // ranks_per_domain
    hidden, probs, scales = [], [], []
    for source in everyone:
        wanted = source["routing_map"][:, rank * experts:(rank + 1) * experts].any(dim=1)
        hidden.append(source["hidden"][wanted])
        if source.get("probs") is not None:
            probs.append(source["probs"][wanted][:, node * node_width:(node + 1) * node_width])
        if source.get("scaling_factor") is not None:
            scales.append(source["scaling_factor"][wanted])
    return (torch.cat(hidden), torch.cat(probs) if probs else None,
            torch.cat(scales) if scales else None)


def copies_per_token(routing_map: torch.Tensor, experts: int) -> torch.Tensor:
    """How many ranks receive each token."""
    tokens, total = routing_map.shape
    return routing_map.view(tokens, total // experts, experts).any(-1).sum(-1)


def expected_combine_of_dispatch(hidden: torch.Tensor, routing_map: torch.Tensor,
                                 experts: int, ranks_per_domain: int | None = None,
                                 wire: str = "bf16") -> torch.Tensor:
    """combine(dispatch(x)) = x times its copy count (exact in fp32 for small counts); across
    NVLink domains of ``ranks_per_domain`` with the BF16 wire, each domain's partial
    (x times the copies there) is rounded to BF16 first and the partials summed in fp32 in
    ascending domain order (docs/semantics.md, combine)."""
    tokens, total = routing_map.shape
    per_rank = routing_map.view(tokens, total // experts, experts).any(-1).to(torch.float32)
    ranks = per_rank.shape[1]
    if ranks_per_domain is None or ranks_per_domain == ranks or wire == "fp32":
        return (hidden.float() * per_rank.sum(-1, keepdim=True)).to(torch.bfloat16)
    per_domain = per_rank.view(tokens, ranks // ranks_per_domain, ranks_per_domain).sum(-1)
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    for n in range(per_domain.shape[1]):
        part = (hidden.float() * per_domain[:, n:n + 1]).to(torch.bfloat16).float()
        out = out + torch.where(per_domain[:, n:n + 1] > 0, part, 0.0)
    return out.to(torch.bfloat16)


def assert_same(name: str, got, want) -> None:
    """Bit for bit (through a byte view, so FP8 and NaN payloads compare exactly), or raise."""
    if got is None or want is None:
        assert got is None and want is None, f"{name}: one of result and oracle is None"
        return
    ok = got.shape == want.shape and torch.equal(got.contiguous().view(torch.uint8),
                                                 want.contiguous().view(torch.uint8))
    if not ok:
        raise AssertionError(f"{name}: differs from the oracle (shape {tuple(got.shape)} vs "
                             f"{tuple(want.shape)}); no numbers are reported for a wrong kernel")
