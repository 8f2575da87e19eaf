"""hybrid_ep.memory_plan, HybridEPBuffer.registered_bytes and ``hybrid-ep memory``: the plan is
the runtime's own layout (Runtime.bytes_for) for every config, on the CPU."""

from __future__ import annotations

import itertools
import json

import pytest

import hybrid_ep
from hybrid_ep import cli, native
from hybrid_ep.config import receive_rows
from hybrid_ep.memory_plan import NETWORK_FLAGS, NETWORK_TILES, REGIONS, padding
from hybrid_ep.zero_copy import pool_bytes

TOPOLOGIES = [(1, 1), (2, 2), (4, 2), (8, 4), (16, 8)]
GRID = list(itertools.product(TOPOLOGIES, (1024, 7168), (128, 4096), (1, 8), ("bf16", "fp32")))
GRID_IDS = [f"W{w}R{r}-H{h}-T{t}-E{e}-{wire}" for (w, r), h, t, e, wire in GRID]


def _runtime_bytes(world, ranks, hidden, tokens, experts, wire, chunk=64, cap=None) -> int:
    """Runtime::registered_bytes, what a Runtime of this config allocates (with the receive
    cap a HybridEPBuffer of max_num_of_tokens_for_experts=cap gives it)."""
    C = native.module()
    rc = C.RuntimeConfig()
    rc.world, rc.ranks, rc.nodes = world, ranks, world // ranks
    rc.hidden, rc.max_tokens, rc.experts_per_rank = hidden, tokens, experts
    rc.dispatch_chunk = chunk
    rc.combine_wire_fp32 = wire == "fp32"
    rc.max_received = receive_rows(world, tokens, cap)
    # The CUDA engine's pool with the environment's defaults (zero-copy on, automatic size).
    rc.zero_copy_pool_bytes = pool_bytes(True, world // ranks, None, rc.max_received, hidden,
                                         experts, ranks)
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
    # The default receive cap: 64 ranks' tokens, not all 512 (docs/usage.md).
    assert plan["dispatch_rows"] == 64 * 4096 * 7168 * 2
    # Issue 39's target for the regions between domains: the rings (one chunk slot per other
    # domain by default at 64 domains) instead of N x T rows (10.9 GiB before them).
    assert plan["network"] <= 2**29, plan["network"]


def _ring_plan(world, ranks, hidden, tokens, chunk, ring=None):
    options = {} if ring is None else {"net_ring_chunks": ring}
    return hybrid_ep.memory_plan(world, ranks, hidden, tokens, 2, combine_wire="bf16",
                                 num_of_tokens_per_chunk_dispatch_api=chunk, **options)


@pytest.mark.parametrize("world,ranks,ring,slots", [
    (4, 2, 1, 1), (8, 2, 2, 2), (16, 2, 3, 3), (8, 1, 100, 8), (8, 4, None, 8)])
def test_rings_hold_k_chunks_per_other_domain(world, ranks, ring, slots):
    """net_rows / net_partials: (N - 1) x K x chunk rows, K capped at the chunks of T (8 here);
    partials: this rank's T own rows, then its ring."""
    hidden, tokens, chunk = 1024, 500, 64
    plan = _ring_plan(world, ranks, hidden, tokens, chunk, ring)
    rows = (world // ranks - 1) * slots * chunk
    assert plan["net_rows"] == rows * hidden * 2
    assert plan["net_partials"] == rows * hidden * 2
    assert plan["partials"] == (tokens + rows) * hidden * 2
    assert plan["net_probs"] == rows * 2 * ranks * 4
    C = native.module()
    rc = C.RuntimeConfig()
    rc.world, rc.ranks, rc.nodes = world, ranks, world // ranks
    rc.hidden, rc.max_tokens, rc.experts_per_rank, rc.dispatch_chunk = hidden, tokens, 2, chunk
    rc.net_ring_chunks = 0 if ring is None else ring
    assert plan["total"] == C.Runtime.bytes_for(rc)


@pytest.mark.parametrize("world,ranks,ring", [(4, 2, 1), (8, 2, 3), (8, 4, None)])
def test_eager_rings_hold_records_in_tiles(world, ranks, ring):
    """HYBRID_EP_EAGER: each of the (N - 1) x K slots of net_rows holds a chunk's records (the
    widest: a BF16 row with its probs, or an FP8 row with probs and scales) in whole 4 KiB tiles
    of 4080 data bytes, and each slot of net_partials a chunk's combine records (a partial at
    the wire's width and its probs); net_probs, net_scales and net_partial_probs are empty; the
    epochs are two words per operation; the runtime allocates the same."""
    hidden, tokens, chunk = 1024, 500, 64
    options = {} if ring is None else {"net_ring_chunks": ring}
    plan = hybrid_ep.memory_plan(world, ranks, hidden, tokens, 2, combine_wire="bf16",
                                 num_of_tokens_per_chunk_dispatch_api=chunk, eager=True,
                                 **options)
    slots = (world // ranks - 1) * (ring or 8)
    probs = 2 * ranks * 4
    record = max(hidden * 2 + probs, hidden + probs + hidden // 128 * 4)
    slot = -(-(chunk * record) // 4080) * 4096
    assert plan["net_rows"] == slots * slot
    assert plan["net_probs"] == plan["net_scales"] == plan["net_partial_probs"] == 0
    assert plan["net_partials"] == slots * -(-(chunk * (hidden * 2 + probs)) // 4080) * 4096
    assert plan["eager_epoch"] == 32
    C = native.module()
    rc = C.RuntimeConfig()
    rc.world, rc.ranks, rc.nodes = world, ranks, world // ranks
    rc.hidden, rc.max_tokens, rc.experts_per_rank, rc.dispatch_chunk = hidden, tokens, 2, chunk
    rc.net_ring_chunks = 0 if ring is None else ring
    rc.eager = True
    assert plan["total"] == C.Runtime.bytes_for(rc)
    signalled = hybrid_ep.memory_plan(world, ranks, hidden, tokens, 2, combine_wire="bf16",
                                      num_of_tokens_per_chunk_dispatch_api=chunk, eager=False,
                                      **options)
    assert signalled["net_probs"] > 0 and signalled["net_rows"] < plan["net_rows"]


def test_eager_staging_exists_only_towards_unmapped_peers():
    """The eager form's staging slots (the one RDMA write's source) are empty in the p2p build,
    whose peers are mapped; under HYBRID_EP_FAULT=unmapped_peers (and in the RDMA builds) they
    mirror the receive rings: (N - 1) x K slots of rows and of combine records."""
    world, ranks, hidden, tokens, chunk, ring = 8, 2, 1024, 500, 64, 3
    plan = hybrid_ep.memory_plan(world, ranks, hidden, tokens, 2, combine_wire="bf16",
                                 num_of_tokens_per_chunk_dispatch_api=chunk, eager=True,
                                 net_ring_chunks=ring)
    assert plan["eager_rows_staging"] == plan["eager_partials_staging"] == 0
    C = native.module()
    rc = C.RuntimeConfig()
    rc.world, rc.ranks, rc.nodes = world, ranks, world // ranks
    rc.hidden, rc.max_tokens, rc.experts_per_rank, rc.dispatch_chunk = hidden, tokens, 2, chunk
    rc.net_ring_chunks, rc.eager = ring, True
    assert C.Runtime.bytes_for(rc) == plan["total"]
    rc.unmapped_peers = True
    staged = plan["net_rows"] + plan["net_partials"]  # the same slots, 256-byte aligned already
    assert C.Runtime.bytes_for(rc) - plan["total"] in range(staged, staged + 2 * 256)
    rc.eager = False
    signalled = hybrid_ep.memory_plan(world, ranks, hidden, tokens, 2, combine_wire="bf16",
                                      num_of_tokens_per_chunk_dispatch_api=chunk, eager=False,
                                      net_ring_chunks=ring)
    assert C.Runtime.bytes_for(rc) == signalled["total"]


def test_eager_follows_the_environment_and_is_checked(monkeypatch):
    monkeypatch.setenv("HYBRID_EP_EAGER", "1")
    assert hybrid_ep.memory_plan(8, 2, 1024, 500, 2)["net_probs"] == 0
    monkeypatch.setenv("HYBRID_EP_EAGER", "0")
    assert hybrid_ep.memory_plan(8, 2, 1024, 500, 2)["net_probs"] > 0
    with pytest.raises(TypeError, match="eager"):
        hybrid_ep.memory_plan(8, 2, 1024, 500, 2, eager="yes")
    monkeypatch.setenv("HYBRID_EP_EAGER", "on")
    with pytest.raises(ValueError, match="HYBRID_EP_EAGER"):
        hybrid_ep.memory_plan(8, 2, 1024, 500, 2)


@pytest.mark.parametrize("nodes,slots", [(2, 64), (4, 64), (5, 64), (6, 14), (8, 10), (16, 4),
                                         (64, 1)])
def test_default_ring_depth(nodes, slots):
    """Unset, K is every chunk of T = 4096 while that ring stays within 256 MiB of rows (hidden
    7168, BF16, 64-token chunks: 896 KiB a slot), else the deepest ring of whole chunks within
    64 MiB, at least one slot."""
    plan = _ring_plan(nodes * 8, 8, 7168, 4096, 64)
    assert plan["net_rows"] == (nodes - 1) * slots * 64 * 7168 * 2
    if slots == 64:
        assert plan["net_rows"] <= 256 * 2**20
    else:
        assert plan["net_rows"] <= 64 * 2**20 or slots == 1


def test_ring_depth_follows_the_environment(monkeypatch):
    monkeypatch.setenv("HYBRID_EP_NET_RING_CHUNKS", "3")
    assert _ring_plan(8, 2, 1024, 500, 64)["net_rows"] == 3 * 3 * 64 * 1024 * 2
    monkeypatch.setenv("HYBRID_EP_NET_RING_CHUNKS", "auto")
    assert _ring_plan(8, 2, 1024, 500, 64) == _ring_plan(8, 2, 1024, 500, 64, ring=8)
    assert _ring_plan(8, 2, 1024, 500, 64, ring=1)["net_rows"] == 3 * 64 * 1024 * 2
    monkeypatch.setenv("HYBRID_EP_NET_RING_CHUNKS", "0")
    with pytest.raises(ValueError, match="HYBRID_EP_NET_RING_CHUNKS='0'"):
        _ring_plan(8, 2, 1024, 500, 64)


def test_the_credit_fault_is_read_and_checked(monkeypatch):
    """HYBRID_EP_FAULT (the GPU tests' starved senders) takes only the faults it names."""
    from hybrid_ep.config import FAULTS, EnvSettings

    assert EnvSettings.read().fault == "off"
    for fault in FAULTS:
        monkeypatch.setenv("HYBRID_EP_FAULT", fault)
        assert EnvSettings.read().fault == fault
    monkeypatch.setenv("HYBRID_EP_FAULT", "withhold_credits")
    with pytest.raises(ValueError, match="HYBRID_EP_FAULT='withhold_credits'"):
        EnvSettings.read()


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


RECEIVE_REGIONS = ("dispatch_rows", "dispatch_probs", "dispatch_scales", "combine_rows",
                   "combine_probs")
CAPS = [(1, 1, 16, None), (1, 1, 16, 1), (4, 2, 128, 100), (8, 4, 128, 128 * 8),
        (16, 8, 64, 10**6), (64, 8, 64, None), (128, 8, 64, None), (512, 8, 4096, 8 * 4096)]


@pytest.mark.parametrize("world,ranks,tokens,cap", CAPS,
                         ids=[f"W{w}R{r}-T{t}-cap{c}" for w, r, t, c in CAPS])
def test_receive_cap_sizes_the_receive_regions(world, ranks, tokens, cap):
    """max_num_of_tokens_for_experts sizes the five receive regions (at most W x T rows; None:
    min(W, 64) x T), as the runtime lays them out, and, with one domain, the zero-copy pool
    (a multiple of the dispatch outputs at the cap), nothing else."""
    hidden, experts = 1024, 4
    plan = hybrid_ep.memory_plan(world, ranks, hidden, tokens, experts, combine_wire="bf16",
                                 num_of_tokens_per_chunk_dispatch_api=64,
                                 max_num_of_tokens_for_experts=cap)
    assert plan["total"] == _runtime_bytes(world, ranks, hidden, tokens, experts, "bf16",
                                           cap=cap)
    rows = min(world, 64) * tokens if cap is None else min(cap, world * tokens)
    prob_row, scale_row = 4 * experts * ranks, 4 * (hidden // 128)
    assert [plan[name] for name in RECEIVE_REGIONS] == [
        rows * 2 * hidden, rows * prob_row, rows * scale_row, rows * 4 * hidden, rows * prob_row]
    uncapped = hybrid_ep.memory_plan(world, ranks, hidden, tokens, experts, combine_wire="bf16",
                                     num_of_tokens_per_chunk_dispatch_api=64,
                                     max_num_of_tokens_for_experts=world * tokens)
    sized = (*RECEIVE_REGIONS, "zero_copy_pool", "total")
    assert {k: v for k, v in plan.items() if k not in sized} == {
        k: v for k, v in uncapped.items() if k not in sized}
    assert plan["zero_copy_pool"] == pool_bytes(True, world // ranks, None, rows, hidden, experts,
                                                ranks)


def test_zero_copy_pool_in_the_plan(monkeypatch):
    """The pool: by default none with several domains; the option, HYBRID_EP_ZERO_COPY_POOL_MB
    (with several domains too: a pool of network sources) and HYBRID_EP_ZERO_COPY size it, the
    runtime's layout agreeing."""
    args = (8, 8, 1024, 128, 4)
    several = (16, 8, 1024, 128, 4)
    assert hybrid_ep.memory_plan(*several)["zero_copy_pool"] == 0
    assert hybrid_ep.memory_plan(*args)["zero_copy_pool"] > 0
    plan = hybrid_ep.memory_plan(*args, zero_copy_pool_bytes=5 << 20)
    assert plan["zero_copy_pool"] == 5 << 20
    assert plan["total"] - hybrid_ep.memory_plan(*args, zero_copy_pool_bytes=0)["total"] == 5 << 20
    monkeypatch.setenv("HYBRID_EP_ZERO_COPY_POOL_MB", "3")
    assert hybrid_ep.memory_plan(*args)["zero_copy_pool"] == 3 << 20
    assert hybrid_ep.memory_plan(*several)["zero_copy_pool"] == 3 << 20
    monkeypatch.setenv("HYBRID_EP_ZERO_COPY", "0")
    assert hybrid_ep.memory_plan(*args)["zero_copy_pool"] == 0
    with pytest.raises(ValueError, match="zero_copy_pool_bytes=-1"):
        hybrid_ep.memory_plan(*args, zero_copy_pool_bytes=-1)


def test_receive_cap_target_config():
    """Issue 39's target config: the five receive regions sized by 8 x 4096 rows."""
    plan = hybrid_ep.memory_plan(512, 8, 7168, 4096, 8, max_num_of_tokens_for_experts=8 * 4096)
    rows = 8 * 4096
    assert plan["dispatch_rows"] == rows * 7168 * 2 and plan["combine_rows"] == rows * 7168 * 4
    assert plan["dispatch_probs"] == plan["combine_probs"] == rows * 8 * 8 * 4
    assert plan["dispatch_scales"] == rows * 56 * 4
    assert sum(plan[name] for name in RECEIVE_REGIONS) < 1.5 * 2**30


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
    ({"max_num_of_tokens_for_experts": 0}, ValueError, "max_num_of_tokens_for_experts=0"),
    ({"max_num_of_tokens_for_experts": 8.5}, TypeError, "max_num_of_tokens_for_experts"),
    ({"max_num_of_tokens_for_experts": True}, TypeError, "max_num_of_tokens_for_experts"),
    ({"net_ring_chunks": 0}, ValueError, "net_ring_chunks=0"),
    ({"net_ring_chunks": 1.5}, TypeError, "net_ring_chunks"),
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


def test_cli_takes_the_receive_cap(capsys):
    assert cli.main(["memory", "--world", "512", "--ranks-per-domain", "8", "--hidden", "7168",
                     "--tokens", "4096", "--experts-per-rank", "8",
                     "--max-tokens-for-experts", "32768"]) == 0
    plan = hybrid_ep.memory_plan(512, 8, 7168, 4096, 8, max_num_of_tokens_for_experts=32768)
    assert capsys.readouterr().out.splitlines()[-1].split()[1] == f"{plan['total']:,}"
    with pytest.raises(SystemExit):
        cli.main(["memory", "--world", "16", "--ranks-per-domain", "8", "--hidden", "7168",
                  "--tokens", "4096", "--experts-per-rank", "8", "--max-tokens-for-experts", "0"])
    assert "--max-tokens-for-experts" in capsys.readouterr().err


def test_cli_takes_the_ring_depth(capsys):
    assert cli.main(["memory", "--world", "32", "--ranks-per-domain", "8", "--hidden", "7168",
                     "--tokens", "4096", "--experts-per-rank", "8", "--net-ring-chunks", "2"]) == 0
    plan = hybrid_ep.memory_plan(32, 8, 7168, 4096, 8, net_ring_chunks=2)
    assert plan["net_rows"] == 3 * 2 * 64 * 7168 * 2
    rows = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()[1:]
            if not line.startswith("-")}
    assert rows["net_rows"] == f"{plan['net_rows']:,}"


def test_cli_takes_the_eager_form(capsys):
    assert cli.main(["memory", "--world", "32", "--ranks-per-domain", "8", "--hidden", "7168",
                     "--tokens", "4096", "--experts-per-rank", "8", "--eager", "1"]) == 0
    plan = hybrid_ep.memory_plan(32, 8, 7168, 4096, 8, eager=True)
    assert plan["net_probs"] == 0
    rows = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()[1:]
            if not line.startswith("-")}
    assert rows["net_rows"] == f"{plan['net_rows']:,}" and rows["net_probs"] == "0"


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


def disagreement(variable: str, value: str) -> str:
    """Runs on every rank of a 2-rank pool: rank 1 sets ``variable`` to ``value``, which shapes
    the layout; every rank's construction raises, naming the variable."""
    import os

    from cases.common import job_group, rank

    if rank() == 1:
        os.environ[variable] = value
    try:
        hybrid_ep.HybridEPBuffer(job_group(), hidden_dim=256, max_num_of_tokens_per_rank=8,
                                 num_local_experts=2, num_of_hybrid_ep_ranks_per_nvlink_domain=1)
    except ValueError as error:
        return str(error)
    finally:
        os.environ.pop(variable, None)
    return "constructed"


@pytest.mark.parametrize("variable,value", [("HYBRID_EP_NET_RING_CHUNKS", "2"),
                                            ("HYBRID_EP_EAGER", "1")])
def test_layout_settings_must_agree_across_ranks(pools, variable, value):
    messages = pools.run(2, "test_memory_plan", "disagreement", variable=variable, value=value)
    for message in messages:
        assert variable in message and "disagree" in message, messages
