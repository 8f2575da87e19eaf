"""hybrid_ep.memory_plan, HybridEPBuffer.registered_bytes and ``hybrid-ep memory``: the plan is
the runtime's own layout (Runtime.bytes_for) for every config, on the CPU."""

from __future__ import annotations

import itertools
import json

import pytest

import hybrid_ep
from hybrid_ep import cli, native
from hybrid_ep.memory_plan import NETWORK_FLAGS, NETWORK_TILES, REGIONS, padding

TOPOLOGIES = [(1, 1), (2, 2), (4, 2), (8, 4), (16, 8)]
GRID = list(itertools.product(TOPOLOGIES, (1024, 7168), (128, 4096), (1, 8), ("bf16", "fp32")))
GRID_IDS = [f"W{w}R{r}-H{h}-T{t}-E{e}-{wire}" for (w, r), h, t, e, wire in GRID]


def _runtime_bytes(world, ranks, hidden, tokens, experts, wire, chunk=64) -> int:
    """Runtime::registered_bytes, what a Runtime of this config allocates."""
    C = native.module()
    rc = C.RuntimeConfig()
    rc.world, rc.ranks, rc.nodes = world, ranks, world // ranks
    rc.hidden, rc.max_tokens, rc.experts_per_rank = hidden, tokens, experts
    rc.dispatch_chunk = chunk
    rc.combine_wire_fp32 = wire == "fp32"
    return C.Runtime.bytes_for(rc)


@pytest.mark.parametrize("topo,hidden,tokens,experts,wire", GRID, ids=GRID_IDS)
def test_plan_is_the_runtime_layout(topo, hidden, tokens, experts, wire):
    world, ranks = topo
    plan = hybrid_ep.memory_plan(world, ranks, hidden, tokens, experts, combine_wire=wire,
                                 num_of_tokens_per_chunk_dispatch_api=64)
    assert plan["total"] == _runtime_bytes(world, ranks, hidden, tokens, experts, wire)
    assert list(plan) == [*REGIONS, "network", "total"]
    assert all(isinstance(plan[name], int) and plan[name] >= 0 for name in plan), plan
    regions = sum(plan[name] for name in REGIONS)
    assert regions <= plan["total"]
    assert regions + padding(plan) == plan["total"]
    assert padding(plan) < 256 * len(REGIONS)  # at most one alignment per region
    tiles = sum(plan[name] for name in NETWORK_TILES)
    if world == ranks:
        assert plan["network"] == 0 and tiles == 0
    else:
        assert plan["network"] == tiles + sum(plan[name] for name in NETWORK_FLAGS) > 0


@pytest.mark.parametrize("chunk", [1, 16, 128, 4096])
def test_dispatch_chunk_sizes_the_flag_tables(chunk):
    plan = hybrid_ep.memory_plan(8, 4, 1024, 512, 2, combine_wire="bf16",
                                 num_of_tokens_per_chunk_dispatch_api=chunk)
    assert plan["total"] == _runtime_bytes(8, 4, 1024, 512, 2, "bf16", chunk)
    assert plan["network_flags"] == 8 * 2 * -(-512 // chunk)


def test_fp32_wire_doubles_the_partials():
    bf16 = hybrid_ep.memory_plan(16, 8, 7168, 4096, 8, combine_wire="bf16")
    fp32 = hybrid_ep.memory_plan(16, 8, 7168, 4096, 8, combine_wire="fp32")
    for name in ("partials", "net_partials"):
        assert fp32[name] == 2 * bf16[name] > 0
    assert fp32["total"] - bf16["total"] == bf16["partials"] + bf16["net_partials"]


def test_plan_is_not_bounded_by_the_engine_rank_limit():
    plan = hybrid_ep.memory_plan(512, 8, 7168, 4096, 8, combine_wire="bf16",
                                 num_of_tokens_per_chunk_dispatch_api=64)
    assert plan["total"] == _runtime_bytes(512, 8, 7168, 4096, 8, "bf16")
    assert 90 * 2**30 < plan["total"] < 100 * 2**30, plan["total"]  # routing: 16 MiB of it
    assert 10 * 2**30 < plan["network"] < 12 * 2**30, plan["network"]


@pytest.mark.parametrize("topo,hidden,tokens,experts,wire", GRID, ids=GRID_IDS)
def test_routing_is_one_domains_bits_per_token(topo, hidden, tokens, experts, wire):
    """Every rank's tokens, as 32-bit words of bits of the receiving domain's E*R experts; with
    several domains this rank's bits for each other domain are staged for the network puts."""
    world, ranks = topo
    plan = hybrid_ep.memory_plan(world, ranks, hidden, tokens, experts, combine_wire=wire)
    row = -(-experts * ranks // 32) * 4
    assert plan["routing"] == world * tokens * row
    assert plan["staged_routing"] == (world // ranks - 1) * tokens * row


def test_routing_at_512_ranks_is_16_mib():
    """512 ranks (64 domains of 8) x 4096 tokens x 8 experts: 64 bits a token, not the 4096
    bools of every expert (8 GiB)."""
    plan = hybrid_ep.memory_plan(512, 8, 7168, 4096, 8)
    assert plan["routing"] == 16 * 2**20
    assert plan["staged_routing"] == 63 * 4096 * 8


def test_defaults_follow_the_environment(monkeypatch):
    monkeypatch.delenv("HYBRID_EP_COMBINE_WIRE", raising=False)
    monkeypatch.delenv("NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API", raising=False)
    assert hybrid_ep.memory_plan(4, 2, 1024, 256, 2) == hybrid_ep.memory_plan(
        4, 2, 1024, 256, 2, combine_wire="bf16", num_of_tokens_per_chunk_dispatch_api=64)
    monkeypatch.setenv("HYBRID_EP_COMBINE_WIRE", "fp32")
    monkeypatch.setenv("NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API", "32")
    assert hybrid_ep.memory_plan(4, 2, 1024, 256, 2) == hybrid_ep.memory_plan(
        4, 2, 1024, 256, 2, combine_wire="fp32", num_of_tokens_per_chunk_dispatch_api=32)
    # An explicit option wins over the variable.
    assert hybrid_ep.memory_plan(4, 2, 1024, 256, 2, combine_wire="bf16")["partials"] == (
        2 * 256 * 1024 * 2)


GOOD = {"world_size": 8, "ranks_per_domain": 4, "hidden_dim": 1024,
        "max_num_of_tokens_per_rank": 128, "num_local_experts": 2}
BAD = [
    ({"world_size": 0}, ValueError, "world_size=0"),
    ({"world_size": 8.0}, TypeError, "world_size"),
    ({"ranks_per_domain": 3}, ValueError, "ranks_per_domain=3"),
    ({"ranks_per_domain": 0}, ValueError, "ranks_per_domain=0"),
    ({"ranks_per_domain": True}, TypeError, "ranks_per_domain"),
    ({"hidden_dim": 1000}, ValueError, "hidden_dim=1000"),
    ({"hidden_dim": -16}, ValueError, "hidden_dim=-16"),
    ({"max_num_of_tokens_per_rank": 0}, ValueError, "max_num_of_tokens_per_rank=0"),
    ({"num_local_experts": "8"}, TypeError, "num_local_experts"),
    ({"combine_wire": "fp8"}, ValueError, "combine_wire='fp8'"),
    ({"num_of_tokens_per_chunk_dispatch_api": 0}, ValueError,
     "num_of_tokens_per_chunk_dispatch_api=0"),
    ({"max_num_of_tokens_per_rank": 2**50}, ValueError, "max_num_of_tokens_per_rank="),
    ({"use_fp8": True}, TypeError, "'use_fp8'"),
]


@pytest.mark.parametrize("change,error,named", BAD, ids=[str(b[0]) for b in BAD])
def test_bad_arguments_raise_naming_them(change, error, named):
    with pytest.raises(error, match="expected") as caught:
        hybrid_ep.memory_plan(**{**GOOD, **change})
    assert named in str(caught.value), str(caught.value)


def test_cli_prints_the_table(capsys, tmp_path):
    out = tmp_path / "plan.json"
    assert cli.main(["memory", "--world", "16", "--ranks-per-domain", "8", "--hidden", "7168",
                     "--tokens", "4096", "--experts-per-rank", "8", "--combine-wire", "fp32",
                     "--json", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    plan = hybrid_ep.memory_plan(16, 8, 7168, 4096, 8, combine_wire="fp32")
    assert lines[0].split() == ["region", "bytes", "GiB"]
    names = [line.split()[0] for line in lines[1:] if not line.startswith("-")]
    assert names == [*REGIONS, "(alignment", "network", "total"]
    total = lines[-1].split()
    assert total[1] == f"{plan['total']:,}" and total[2] == f"{plan['total'] / 2**30:.3f}"
    assert lines[-2].split()[1] == f"{plan['network']:,}"
    assert json.loads(out.read_text()) == plan


def test_cli_rejects_a_bad_config(capsys):
    with pytest.raises(SystemExit) as caught:
        cli.main(["memory", "--world", "12", "--ranks-per-domain", "8", "--hidden", "7168",
                  "--tokens", "4096", "--experts-per-rank", "8"])
    assert "ranks_per_domain=8" in str(caught.value)
    with pytest.raises(SystemExit):
        cli.main(["memory", "--world", "16", "--ranks-per-domain", "8", "--hidden", "7168",
                  "--tokens", "0", "--experts-per-rank", "8"])
    assert "--tokens" in capsys.readouterr().err


def reference_registered_bytes() -> list[int]:
    """Runs on every rank of a 2-rank pool (two domains of one rank): the reference engine's
    figure is the plan of the buffer's config, before and after a blocking call grows it."""
    import warnings

    import torch

    from cases.common import job_group, rank

    buf = hybrid_ep.HybridEPBuffer(job_group(), hidden_dim=256, max_num_of_tokens_per_rank=8,
                                   num_local_experts=2,
                                   num_of_hybrid_ep_ranks_per_nvlink_domain=1)
    sizes = [buf.registered_bytes()]
    assert sizes[0] == hybrid_ep.memory_plan(2, 1, 256, 8, 2)["total"], sizes
    tokens = 12 if rank() == 0 else 5  # more than the buffer holds: it grows to 12
    hidden = torch.ones(tokens, 256, dtype=torch.bfloat16)
    routing = torch.ones(tokens, 4, dtype=torch.bool)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        buf.dispatch(hidden, routing_map=routing, probs=routing.float())
    assert buf.max_num_of_tokens_per_rank == 12
    # Every rank grows, and the warning points at the call that grew the buffer.
    grew = [w for w in caught if "growing" in str(w.message)]
    assert [(w.category, w.filename) for w in grew] == [(RuntimeWarning, __file__)], grew
    sizes.append(buf.registered_bytes())
    assert sizes[1] == hybrid_ep.memory_plan(2, 1, 256, 12, 2)["total"], sizes
    return sizes


def test_registered_bytes_on_the_reference_engine(pools):
    sizes = pools.run(2, "test_memory_plan", "reference_registered_bytes")
    assert sizes[0] == sizes[1] and sizes[0][1] > sizes[0][0], sizes
