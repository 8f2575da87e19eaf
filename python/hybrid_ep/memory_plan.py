"""The registered buffer's size before it is allocated: ``memory_plan``, its table for
``hybrid-ep memory`` and the figure behind ``HybridEPBuffer.registered_bytes``."""

from __future__ import annotations

from . import native, transport_options
from . import validation as v
from .config import env_bool, env_choice, env_int, net_ring_chunks_from_env, receive_rows
from .topology import check_ranks_per_domain
from .zero_copy import pool_bytes

# BufferLayout's regions (csrc/hybrid_ep/memory/layout.h) in the order they lie in the buffer;
# the plan itself follows the binding's walk, so a region added there shows up in it (and the
# tests, which compare the two, name it).
REGIONS = ("routing", "staged_routing", "token_counts", "call_stamps", "barrier_stamps",
           "net_barrier_stamps", "dispatch_rows", "dispatch_probs", "dispatch_scales",
           "combine_rows", "combine_probs", "net_rows", "net_probs", "net_scales",
           "restriped_probs", "staged_rows", "staged_scales", "partials", "partial_probs",
           "net_partials", "net_partial_probs", "eager_rows_staging", "eager_partials_staging",
           "receive_targets", "combine_pulled",
           "zero_copy_pool",
           "barrier_flags", "forward_flags",
           "dispatch_flags", "unpermute_flags", "network_flags", "combine_flags",
           "dispatch_credits", "combine_credits",
           "net_barrier_flags", "receive_releases", "eager_epoch")
# Regions only traffic between domains uses. The tiles are empty with one domain; the flag
# tables keep one row per domain even then (this domain's, never used), so they count only
# with several domains.
NETWORK_TILES = ("staged_routing", "net_rows", "net_probs", "net_scales", "restriped_probs",
                 "staged_rows", "staged_scales", "partials", "partial_probs", "net_partials",
                 "net_partial_probs", "eager_rows_staging", "eager_partials_staging")
NETWORK_FLAGS = ("network_flags", "combine_flags", "dispatch_credits", "combine_credits",
                 "net_barrier_flags", "net_barrier_stamps", "eager_epoch")
_OPTIONS = ("combine_wire", "num_of_tokens_per_chunk_dispatch_api", "net_ring_chunks",
            "max_num_of_tokens_for_experts", "zero_copy_pool_bytes", "eager")
_WIRES = ("bf16", "fp32")
# Past this a region's size would no longer fit the layout's 64-bit arithmetic.
_MAX_DOMINANT_BYTES = 2**58


def memory_plan(world_size, ranks_per_domain, hidden_dim, max_num_of_tokens_per_rank,
                num_local_experts, **options) -> dict[str, int]:
    """Bytes of the registered buffer each rank of a ``HybridEPBuffer`` of this config would
    allocate on the CUDA engine, computed by the runtime's own layout code (``BufferLayout``
    over the shape a ``Runtime`` builds) without a GPU and without allocating anything.

    Returns a dict: every region of the layout (``REGIONS``, in buffer order) -> its bytes,
    without the padding that aligns the next region to 256 bytes; then ``network``, the bytes
    only traffic between NVLink domains uses: the regions ``NETWORK_TILES`` (staged_routing,
    net_rows, net_probs, net_scales, restriped_probs, staged_rows, staged_scales, partials,
    partial_probs, net_partials, net_partial_probs, eager_rows_staging,
    eager_partials_staging) plus, with several domains, the flag tables
    ``NETWORK_FLAGS`` (network_flags, combine_flags, net_barrier_flags, net_barrier_stamps,
    eager_epoch;
    with one domain they hold only this domain's unused row, so ``network`` is 0); and
    ``total``, the bytes allocated (``Runtime.bytes_for``), alignment padding included: the
    regions sum to ``total`` less that padding (at most 255 bytes per region).

    Options, the settings besides the arguments that change the layout (None or absent: what
    a buffer built now would use):
      combine_wire: "bf16" or "fp32", the combine's partial sums between domains at 2 or 4
        bytes a value (default: HYBRID_EP_COMBINE_WIRE, else "bf16").
      num_of_tokens_per_chunk_dispatch_api: tokens per dispatch chunk, which sizes the flag
        tables and the rings' slots (default: NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API, else 64).
      net_ring_chunks: chunk slots per other domain of the rings between domains, >= 1
        (default: HYBRID_EP_NET_RING_CHUNKS, else every chunk while the ring stays within 256 MiB,
        else the deepest ring within 64 MiB); capped at the chunks of max_num_of_tokens_per_rank.
      max_num_of_tokens_for_experts: the receive cap, rows of the in-domain receive regions
        (dispatch_rows, dispatch_probs, dispatch_scales, combine_rows, combine_probs), at most
        world_size x max_num_of_tokens_per_rank (default: HybridEPBuffer's,
        min(world_size, 64) x max_num_of_tokens_per_rank).
      zero_copy_pool_bytes: the zero-copy pool (docs/zero-copy.md) (default: none with
        HYBRID_EP_ZERO_COPY=0, HYBRID_EP_ZERO_COPY_POOL_MB when set, else inside one domain 4
        dispatches' outputs at the receive cap and with several domains none).
      eager: True for the eager form between domains (HYBRID_EP_EAGER, docs/multi-domain.md):
        net_rows then holds every chunk's records in tiles and net_probs, net_scales are empty
        (default: HYBRID_EP_EAGER, else False; as in a buffer, only the p2p build has the form).

    It reports what the layout needs at any size: the CUDA engine's limits (docs/engine.md,
    "Limits") do not apply. Unknown options raise TypeError; a bad value raises ValueError (or
    TypeError for a non-int) naming the argument, the value and what was expected.
    """
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"memory_plan: unknown option(s) {', '.join(map(repr, unknown))}; "
                        f"expected {' or '.join(_OPTIONS)}")
    world = v.require_int("world_size", world_size, minimum=1)
    ranks = check_ranks_per_domain(ranks_per_domain, world, "ranks_per_domain")
    hidden = v.require_int("hidden_dim", hidden_dim, minimum=1)
    if hidden % v.BF16_ALIGN != 0:
        raise ValueError(f"hidden_dim={hidden}: expected a multiple of {v.BF16_ALIGN}")
    tokens = v.require_int("max_num_of_tokens_per_rank", max_num_of_tokens_per_rank, minimum=1)
    experts = v.require_int("num_local_experts", num_local_experts, minimum=1)
    wire = options.get("combine_wire")
    if wire is None:
        wire = env_choice("HYBRID_EP_COMBINE_WIRE", "bf16", _WIRES)
    elif wire not in _WIRES:
        raise ValueError(f"combine_wire={wire!r}: expected 'bf16' or 'fp32'")
    chunk = options.get("num_of_tokens_per_chunk_dispatch_api")
    if chunk is None:
        chunk = env_int("NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API", 64, 1, 4096)
    chunk = v.require_int("num_of_tokens_per_chunk_dispatch_api", chunk, minimum=1)
    ring = options.get("net_ring_chunks")
    ring = net_ring_chunks_from_env() if ring is None else v.require_int("net_ring_chunks", ring,
                                                                         minimum=1)
    cap = options.get("max_num_of_tokens_for_experts")
    if cap is not None:
        cap = v.require_int("max_num_of_tokens_for_experts", cap, minimum=1)
    # Every region is at most a small multiple of this (rows x the widest per-row bytes).
    dominant = world * tokens * (world * experts + 8 * hidden + 8 * experts * ranks)
    if dominant > _MAX_DOMINANT_BYTES:
        raise ValueError(f"world_size={world}, max_num_of_tokens_per_rank={tokens}, "
                         f"hidden_dim={hidden}, num_local_experts={experts}: too large for the "
                         "layout's 64-bit sizes; expected a smaller config")
    received = receive_rows(world, tokens, cap)
    pool = options.get("zero_copy_pool_bytes")
    if pool is None:
        pool = pool_bytes(env_bool("HYBRID_EP_ZERO_COPY", True), world // ranks,
                          env_int("HYBRID_EP_ZERO_COPY_POOL_MB", None, 1, 1 << 30), received,
                          hidden, experts, ranks)
    pool = v.require_int("zero_copy_pool_bytes", pool, minimum=0)
    eager = options.get("eager")
    if eager is None:
        eager = transport_options.eager_in_effect(
            transport_options.build_transport(), world // ranks,
            env_choice("HYBRID_EP_EAGER", "0", ("0", "1")) == "1", warn=False)
    elif not isinstance(eager, bool):
        raise TypeError(f"eager={eager!r}: expected True or False")
    sizes = native.module().buffer_layout(world, ranks, experts, tokens, hidden, chunk,
                                          wire == "fp32", ring, received, pool, eager)
    plan = {name: int(size) for name, size in sizes.items()
            if name not in ("total", "net_ring_chunks")}
    network = sum(plan[name] for name in NETWORK_TILES)
    if world // ranks > 1:
        network += sum(plan[name] for name in NETWORK_FLAGS)
    plan["network"] = network
    plan["total"] = int(sizes["total"])
    return plan


def plan_of_config(config, combine_wire: str) -> dict[str, int]:
    """memory_plan of a buffer's HybridEPConfig (capacity as it is now)."""
    return memory_plan(config.group_size, config.num_of_ranks_per_node, config.hidden_dim,
                       config.max_num_of_tokens_per_rank, config.num_local_experts,
                       combine_wire=combine_wire,
                       num_of_tokens_per_chunk_dispatch_api=(
                           config.num_of_tokens_per_chunk_dispatch_api),
                       max_num_of_tokens_for_experts=config.max_num_of_tokens_for_experts)


def registered_bytes(config, combine_wire: str, cuda_engine) -> int:
    """HybridEPBuffer.registered_bytes: the CUDA engine's live buffer once one is allocated,
    else (the reference engine registers nothing) the plan of the buffer's config."""
    runtime = getattr(cuda_engine, "runtime", None)
    if runtime is not None:
        return int(runtime.registered_bytes())
    return plan_of_config(config, combine_wire)["total"]


def padding(plan: dict[str, int]) -> int:
    """Bytes of the plan's total that align regions rather than hold data."""
    return plan["total"] - sum(size for _, size in _regions(plan))


def _regions(plan: dict[str, int]) -> list[tuple[str, int]]:
    return [(name, size) for name, size in plan.items() if name not in ("network", "total")]


def format_table(plan: dict[str, int]) -> str:
    """The plan as a table: one line per region, then the padding, network and total."""
    rows = _regions(plan)
    regions = len(rows)
    rows += [("(alignment padding)", padding(plan)), ("network", plan["network"]),
             ("total", plan["total"])]
    width = max(len(name) for name, _ in rows)
    lines = [f"{'region':<{width}}  {'bytes':>15}  {'GiB':>9}"]
    for i, (name, size) in enumerate(rows):
        if i == regions:
            lines.append("-" * len(lines[0]))
        lines.append(f"{name:<{width}}  {size:>15,}  {size / 2**30:>9.3f}")
    return "\n".join(lines)
