"""Rank code of the multi-domain GPU tests that the shared cases do not cover: the network
counters of the CUDA engine (HybridEPBuffer.transport_stats) against the reference engine's
model of the same calls, and the exact put counts of dense and run-structured routing."""

from __future__ import annotations

import importlib

import gpu_cases
import torch
from gpu_cases import Ctx, job

from cases.common import env
from cases.network import E, counter_routing  # the CPU counter tests' routings


@job
def counters(ctx: Ctx, R: int, pattern: str, dtype: str, with_probs: bool, channels: int,
             tokens: int) -> dict:
    """transport_stats after one CUDA dispatch and after one CUDA combine, each equal to the
    reference engine's count of the same call; returns both for the exact-count checks."""
    H = 256
    fp8 = dtype == "fp8"
    with env(HYBRID_EP_NUM_CHANNELS=channels):
        buf = ctx.buffer(H, tokens, E, fp8=fp8, num_of_hybrid_ep_ranks_per_nvlink_domain=R)
    g = torch.Generator().manual_seed(ctx.rank)
    rmap = counter_routing(tokens, pattern, R)
    if fp8:
        x = torch.randint(0, 256, (tokens, H), dtype=torch.uint8, generator=g)
        scales = torch.rand(tokens, H // 128, generator=g)
    else:
        x = torch.randn(tokens, H, generator=g).to(torch.bfloat16)
        scales = None
    probs = torch.where(rmap, 0.5, 0.0) if with_probs else None
    result = {}
    for name, device in (("cuda", ctx.dev), ("reference", torch.device("cpu"))):
        def on(t, device=device):
            return None if t is None else t.to(device)

        buf.transport_stats(reset=True)
        out = buf.dispatch(hidden=on(x), scaling_factor=on(scales), routing_map=on(rmap),
                           probs=on(probs))
        ctx.sync()
        result[f"{name}_dispatch"] = buf.transport_stats(reset=True)
        y = torch.ones(out[0].shape[0], H, dtype=torch.bfloat16, device=device)
        buf.combine(hidden=y, probs=out[1], handle=out[3])
        ctx.sync()
        result[f"{name}_combine"] = buf.transport_stats(reset=True)
    for leg in ("dispatch", "combine"):
        got, want = result[f"cuda_{leg}"], result[f"reference_{leg}"]
        assert got == want, f"{ctx.where()} {leg} counters {got}, the reference counts {want}"
    return result


@job
def under_env(ctx: Ctx, environment: dict, case: str, cases_module: str | None = None, **kwargs):
    """Another job (of this module or gpu_cases, or of ``cases_module`` when given) with
    environment variables set for its whole run, so that the buffers it makes read them: e.g. the
    nixl build's HYBRID_EP_NIXL_DIRECT=0."""
    if cases_module is not None:
        function = getattr(importlib.import_module(cases_module), case)
    else:
        function = globals().get(case) or getattr(gpu_cases, case)
    with env(**environment):
        return function.__wrapped__(ctx, **kwargs)
