"""The receive cap (max_num_of_tokens_for_experts) on the reference engine, which the GPU tests
take as the oracle of the CUDA engine's drops: a non-blocking call keeps the first ``cap`` rows
of every rank (the uncapped layout with every row at or past the cap removed) and counts the
rest in dropped_rows(); a blocking call grows the cap instead and equals the uncapped buffer."""

from __future__ import annotations

import warnings

import torch

from .common import make_buffer, raises, rank
from .inputs import gen_inputs, routing_kwargs


def _permute(buf, spec, mine, non_blocking: bool, P: int):
    return buf.dispatch_with_permute(hidden=mine["hidden"], non_blocking=non_blocking,
                                     num_permuted_tokens=P,
                                     **routing_kwargs(spec, mine, permute=True))


def capped_layouts(spec: dict, cap: int) -> dict:
    r = rank()
    mine = gen_inputs(spec, r)
    free = make_buffer(spec)
    capped = make_buffer(spec, max_num_of_tokens_for_experts=cap)
    P = cap * spec["E"]
    want = _permute(free, spec, mine, False, P)[4]
    got = _permute(capped, spec, mine, True, P)[4]
    D = int(want[3])
    kept = min(D, cap)
    assert int(got[3]) == kept, f"[rank {r}] D {int(got[3])}, expected min({D}, {cap})"
    assert int(capped.dropped_rows()) == D - kept, f"[rank {r}] dropped {capped.dropped_rows()}"
    s2d = torch.where(want[0] < cap, want[0], -1)
    assert torch.equal(got[0], s2d), f"[rank {r}] sparse_to_dense_map past the cap"
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), f"[rank {r}] maps"
    assert torch.equal(got[4][:kept], want[4][:kept]) and not got[4][kept:].any(), \
        f"[rank {r}] local_expert_routing_map past the cap"
    assert torch.equal(got[5], want[5].clamp(max=cap)), f"[rank {r}] dense_chunk_layout"
    assert capped.config.received_rows == cap, "a non-blocking call grew the cap"

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grown = capped.dispatch(mine["hidden"], **routing_kwargs(spec, mine))
    plain = free.dispatch(mine["hidden"], **routing_kwargs(spec, mine))
    grew = [w for w in caught if "growing max_num_of_tokens_for_experts" in str(w.message)]
    most = torch.tensor([D])
    torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX)
    assert grew and capped.config.received_rows == int(most), \
        f"[rank {r}] cap {capped.config.received_rows} after a blocking call, warnings {grew}"
    assert int(capped.dropped_rows()) == 0
    for pos in range(3):
        a, b = grown[pos], plain[pos]
        assert (a is None and b is None) or torch.equal(a.view(torch.uint8), b.view(torch.uint8)), \
            f"[rank {r}] grown dispatch output {pos} differs from the uncapped one"
    # Capacity only grows; a larger value raises it.
    capped.update_template_config(max_num_of_tokens_for_experts=1)
    assert capped.config.received_rows == int(most)
    capped.update_template_config(max_num_of_tokens_for_experts=int(most) + 1)
    assert capped.config.max_num_of_tokens_for_experts == int(most) + 1
    with raises("max_num_of_tokens_for_experts"):
        capped.update_template_config(max_num_of_tokens_for_experts=0)
    return {"D": D, "dropped": D - kept}
