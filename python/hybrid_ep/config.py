"""Buffer configuration and the environment variables that shape it.

Every variable the package reads is declared once in ``ENV_VARS`` (the table of
docs/environment.md is written from the same list); a malformed value raises ``ValueError`` naming the variable.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass

from .backends import doca, nixl_control, p2p_wire
from .backends.p2p_wire import WireSpec


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str
    meaning: str


ENV_VARS = (
    EnvVar("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", "detected",
           "ranks per NVLink domain R; must divide the group size"),
    EnvVar("USE_MNNVL", "0", "1: the whole group is one multi-node NVLink domain (fabric handles)"),
    EnvVar("NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API", "64", "tokens per dispatch chunk"),
    EnvVar("NUM_OF_TOKENS_PER_CHUNK_COMBINE_API", "64", "tokens per combine chunk"),
    EnvVar("NUM_OF_TOKENS_PER_CHUNK_PREPROCESSING_API", "64", "tokens per metadata chunk"),
    EnvVar("NUM_OF_STAGES_DISPATCH_API", "12",
           "shared-memory ring stages of dispatch (clamped to what shared memory holds)"),
    EnvVar("NUM_OF_STAGES_G2S_COMBINE_API", "16",
           "load ring stages of combine (at least ranks per domain; clamped to shared memory)"),
    EnvVar("HYBRID_EP_NUM_CHANNELS", "1", "independent network queues per peer (1-64)"),
    EnvVar("DEEPEP_NIXL_GDA_NUM_CHANNELS", "unset", "alias of HYBRID_EP_NUM_CHANNELS (nixl build)"),
    EnvVar("DEEPEP_NIXL_RUN_ID", "SLURM ids", "run id naming the NIXL agents"),
    EnvVar("HYBRID_EP_NIXL_DIRECT", "1",
           "nixl build: 1 stores directly into the peers UCX maps into the process (cuda_ipc); "
           "0 sends every put through ucp_device_put"),
    EnvVar("HYBRID_EP_NIXL_PROGRESS_THREAD", "0",
           "nixl build: 1 gives each rank's NIXL agent a UCX progress thread (needed only for "
           "host-posted transfers to it); 0 none: the GPU data path needs none, and the threads "
           "took CPU from the ranks"),
    EnvVar("HYBRID_EP_NVSHMEM_DIRECT", "1",
           "nvshmem build: 1 stores directly into the peers NVSHMEM maps into the process "
           "(nvshmem_ptr: P2P/NVLink); 0 sends every put through nvshmemx_putmem_nbi_warp"),
    EnvVar("NIXL_ETCD_ENDPOINTS", "unset",
           "comma-separated http(s)://host:port list; set: NIXL metadata goes through etcd"),
    EnvVar("HYBRID_EP_NIC_MAPPING", "auto",
           "gpu:nic[:port],... RDMA NICs per CUDA device (doca build); several NICs for one GPU "
           "are separate channels; auto: the nearest NICs by PCIe distance"),
    EnvVar("HYBRID_EP_IB_GID_INDEX", "auto",
           "GID index of the NIC ports (doca build, RoCE); auto: the first RoCE v2 IPv4 GID "
           "(0 on InfiniBand)"),
    EnvVar("HYBRID_EP_IB_TRAFFIC_CLASS", "0", "RoCE traffic class, 0-255 (doca build)"),
    EnvVar("HYBRID_EP_DOCA_QP_DEPTH", "auto",
           "send queue entries per queue pair, a power of two up to 32768 (doca build); auto: "
           "the worst case of the buffer config"),
    EnvVar("HYBRID_EP_DOCA_LIB_DIR", "unset",
           "folder holding libdoca_gpunetio_host.so (and libibverbs/libmlx5 if not on the "
           "loader path); read by the doca build when it loads them"),
    EnvVar("HYBRID_EP_TIMEOUT_S", "30",
           "seconds a GPU wait for a peer may take before the call raises instead of hanging"),
    EnvVar("HYBRID_EP_COMBINE_PIECES", "auto",
           "column pieces a combine row moves in (1, 2, 4, ...; hidden must split into multiples "
           "of 8); auto: whole rows unless a row's copies would not fit the ring"),
    EnvVar("HYBRID_EP_COMBINE_WIRE", "bf16",
           "combine between domains: bf16 puts each domain's partial sums rounded once to BF16 "
           "(the bytes of dispatch); fp32 puts them unrounded (twice the bytes)"),
    EnvVar("HYBRID_EP_P2P_WIRE", "off",
           "p2p build, several domains: an emulated NIC between domains, e.g. "
           "gbps=50,latency_us=3,op_ns=400,rails=1,atomic_rtt=1 (GB/s per rail; atomic_rtt=1 "
           "holds a signal after writes one more round trip, a multi-path NIC's fence); a "
           "measurement aid, not a network"),
    EnvVar("HYBRID_EP_PROB_PUTS", "run",
           "dispatch between domains: run puts a run of tokens' probs at once (restriped); token "
           "puts each token's probs on its own, as before the restripe (for comparison)"),
    EnvVar("HYBRID_EP_EAGER", "0",
           "several domains: 1 sends the dispatch's rows and the combine's partials between "
           "domains in the eager form, "
           "records in 4 KiB tiles that each carry their own signal (no signal after a chunk, "
           "none for an empty one); p2p build only so far, other builds warn and signal "
           "(docs/multi-domain.md, \"Eager form\")"),
    EnvVar("HYBRID_EP_NET_RING_CHUNKS", "auto",
           "several domains: chunk slots per other domain of the rings the rows and partials "
           "between domains land in (the receiver credits each consumed slot back); auto: every "
           "chunk while that ring stays within 256 MiB, else the deepest within 64 MiB, at least 1"),
    EnvVar("HYBRID_EP_FAULT", "off",
           "testing only, CUDA engine, several domains: withhold_dispatch_credits or "
           "withhold_combine_credits makes this rank's kernels never credit the ring slots of "
           "that op back, so the other domains' senders time out at the credit wait; "
           "stage_network_sources makes this build's puts read only registered memory, as "
           "doca's do, so that dispatch stages its network sources (unless in the pool); "
           "unmapped_peers (p2p build only) hides the other domains' peers from the kernels, "
           "which then take the RDMA builds' path: puts and signals from registered sources, "
           "the eager form through staged slots and one put per chunk"),
    EnvVar("HYBRID_EP_ZERO_COPY", "1",
           "CUDA engine, one NVLink domain: dispatch outputs are blocks of a pool in the "
           "registered buffer that the peers store into (no copy out), and a combine input in "
           "that pool is read in place (no staging); 0: copy as before (docs/zero-copy.md)"),
    EnvVar("HYBRID_EP_ZERO_COPY_POOL_MB", "auto",
           "MiB of the zero-copy pool per rank (registered with the buffer); auto: inside one "
           "domain 4 dispatches' outputs at the receive cap, with several domains none (there "
           "the pool only holds inputs from empty_zero_copy that the network's puts read in "
           "place). A call the pool cannot hold copies (counted in copy_stats, warned once)"),
    EnvVar("HYBRID_EP_ENGINE", "auto",
           "auto (CPU tensors: reference, CUDA tensors: CUDA engine), reference or cuda"),
    EnvVar("UCX_IB_GDA_MAX_HCA_PER_GPU", "auto (UCX)", "UCX's rails per GPU; passed through, never set"),
    # NVSHMEM's own variables that the nvshmem build sets when unset (backends/nvshmem.py,
    # nvshmem_environment), with several domains only; a user's value always wins.
    EnvVar("NVSHMEM_REMOTE_TRANSPORT", "none on one host",
           "NVSHMEM's transport between hosts (nvshmem build); one host: P2P for every pair"),
    EnvVar("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "lo on one host",
           "interface of NVSHMEM's unique-id bootstrap (nvshmem build); must reach rank 0"),
    EnvVar("NVSHMEM_IB_ENABLE_IBGDA", "1 on several hosts",
           "GPU-initiated RDMA between hosts (nvshmem build)"),
    EnvVar("NVSHMEM_IBGDA_NUM_RC_PER_PE", "HYBRID_EP_NUM_CHANNELS",
           "IBGDA queue pairs per peer (nvshmem build, several hosts)"),
    EnvVar("NVSHMEM_IBGDA_RC_MAP_BY", "cta",
           "block b uses queue pair b % channels, as the channels (nvshmem build, several hosts)"),
    EnvVar("NVSHMEM_IB_GID_INDEX", "HYBRID_EP_IB_GID_INDEX",
           "RoCE GID index (nvshmem build); set only when HYBRID_EP_IB_GID_INDEX is"),
    EnvVar("NVSHMEM_IB_TRAFFIC_CLASS", "HYBRID_EP_IB_TRAFFIC_CLASS",
           "RoCE traffic class (nvshmem build); set only when not 0"),
    EnvVar("NVSHMEM_SYMMETRIC_SIZE", "buffer + 256 MiB",
           "NVSHMEM heap bytes; matters for a static heap (NVSHMEM_DISABLE_CUDA_VMM=1)"),
    EnvVar("NVSHMEM_DISABLE_NVLS", "1", "no NVLink SHARP: no NVSHMEM collectives are used"),
    EnvVar("NVSHMEM_DISABLE_NCCL", "1", "no NCCL inside NVSHMEM: no NVSHMEM collectives are used"),
)

_ENV_NAMES = {v.name for v in ENV_VARS}

# HYBRID_EP_FAULT's injected faults (the timeout tests reach waits no skipped call can).
FAULTS = ("withhold_dispatch_credits", "withhold_combine_credits", "stage_network_sources",
          "unmapped_peers")


def _raw(name: str) -> str | None:
    assert name in _ENV_NAMES, name
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def env_int(name: str, default: int | None, minimum: int = 1, maximum: int | None = None):
    value = _raw(name)
    if value is None:
        return default
    try:
        number = int(value, 10)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r}: expected an integer") from None
    if number < minimum or (maximum is not None and number > maximum):
        upper = f" and <= {maximum}" if maximum is not None else ""
        raise ValueError(f"environment variable {name}={value!r}: expected an integer >= {minimum}"
                         f"{upper}")
    return number


def net_ring_chunks_from_env() -> int:
    """HYBRID_EP_NET_RING_CHUNKS: an integer >= 1, or unset/auto (0: the layout's default)."""
    value = _raw("HYBRID_EP_NET_RING_CHUNKS")
    if value is None or value.strip().lower() == "auto":
        return 0
    return env_int("HYBRID_EP_NET_RING_CHUNKS", 0, 1, 2**31 - 1)


def env_float(name: str, default: float) -> float:
    value = _raw(name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not number > 0 or number == float("inf"):
        raise ValueError(f"environment variable {name}={value!r}: expected a positive number of "
                         "seconds")
    return number


def env_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"environment variable {name}={value!r}: expected 0/1/true/false")


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = _raw(name)
    if value is None:
        return default
    if value not in choices:
        raise ValueError(f"environment variable {name}={value!r}: expected one of {choices}")
    return value


def gid_index_from_env() -> int | None:
    """HYBRID_EP_IB_GID_INDEX: 0-255, or auto/unset (None)."""
    if (_raw("HYBRID_EP_IB_GID_INDEX") or "auto") == "auto":
        return None
    return env_int("HYBRID_EP_IB_GID_INDEX", None, 0, 255)


def num_channels_from_env() -> int:
    primary = env_int("HYBRID_EP_NUM_CHANNELS", None, 1, 64)
    alias = env_int("DEEPEP_NIXL_GDA_NUM_CHANNELS", None, 1, 64)
    if primary is not None and alias is not None and primary != alias:
        raise ValueError(f"environment variables HYBRID_EP_NUM_CHANNELS={primary} and "
                         f"DEEPEP_NIXL_GDA_NUM_CHANNELS={alias} disagree; set one of them")
    return primary or alias or 1


def combine_pieces_from_env() -> int:
    """HYBRID_EP_COMBINE_PIECES: a power of two, or auto/unset (0)."""
    if (_raw("HYBRID_EP_COMBINE_PIECES") or "auto") == "auto":
        return 0
    pieces = env_int("HYBRID_EP_COMBINE_PIECES", 0, 1, 64)
    if pieces & (pieces - 1):
        raise ValueError(f"environment variable HYBRID_EP_COMBINE_PIECES={pieces}: expected a "
                         "power of two (1, 2, 4, ... 64) or auto")
    return pieces


@dataclass(frozen=True)
class EnvSettings:
    """Everything read from the environment, parsed and checked once per buffer."""

    ranks_per_domain: int | None
    use_mnnvl: bool
    tokens_per_chunk_dispatch: int
    tokens_per_chunk_combine: int
    tokens_per_chunk_preprocessing: int
    stages_dispatch: int
    stages_g2s_combine: int
    num_channels: int
    run_id: str | None
    etcd_endpoints: tuple[str, ...]
    nic_mapping: dict | None
    engine: str
    timeout_s: float
    combine_pieces: int = 0  # 0: automatic
    ib_gid_index: int | None = None  # None: automatic
    ib_traffic_class: int = 0
    doca_qp_depth: int | None = None  # None: the buffer's worst case
    nixl_direct: bool = True
    nixl_progress_thread: bool = False
    nvshmem_direct: bool = True
    combine_wire: str = "bf16"  # bf16 or fp32
    p2p_wire: WireSpec | None = None  # HYBRID_EP_P2P_WIRE; None: off
    prob_puts: str = "run"  # run or token
    eager: bool = False  # HYBRID_EP_EAGER
    net_ring_chunks: int = 0  # HYBRID_EP_NET_RING_CHUNKS; 0: automatic
    fault: str = "off"  # HYBRID_EP_FAULT (tests): off or FAULTS
    zero_copy: bool = True  # HYBRID_EP_ZERO_COPY (docs/zero-copy.md)
    zero_copy_pool_mb: int | None = None  # HYBRID_EP_ZERO_COPY_POOL_MB; None: automatic


    @staticmethod
    def read() -> EnvSettings:
        return EnvSettings(
            ranks_per_domain=env_int("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", None),
            use_mnnvl=env_bool("USE_MNNVL", False),
            tokens_per_chunk_dispatch=env_int("NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API", 64, 1, 4096),
            tokens_per_chunk_combine=env_int("NUM_OF_TOKENS_PER_CHUNK_COMBINE_API", 64, 1, 4096),
            tokens_per_chunk_preprocessing=env_int(
                "NUM_OF_TOKENS_PER_CHUNK_PREPROCESSING_API", 64, 1, 4096),
            stages_dispatch=env_int("NUM_OF_STAGES_DISPATCH_API", 12, 1, 64),
            stages_g2s_combine=env_int("NUM_OF_STAGES_G2S_COMBINE_API", 16, 1, 64),
            num_channels=num_channels_from_env(),
            run_id=nixl_control.parse_run_id(_raw("DEEPEP_NIXL_RUN_ID"), os.environ),
            etcd_endpoints=nixl_control.parse_etcd_endpoints(_raw("NIXL_ETCD_ENDPOINTS")),
            nic_mapping=doca.parse_nic_mapping(_raw("HYBRID_EP_NIC_MAPPING")),
            engine=env_choice("HYBRID_EP_ENGINE", "auto", ("auto", "reference", "cuda")),
            timeout_s=env_float("HYBRID_EP_TIMEOUT_S", 30.0),
            combine_pieces=combine_pieces_from_env(),
            ib_gid_index=gid_index_from_env(),
            ib_traffic_class=env_int("HYBRID_EP_IB_TRAFFIC_CLASS", 0, 0, 255),
            doca_qp_depth=doca.parse_qp_depth(_raw("HYBRID_EP_DOCA_QP_DEPTH")),
            nixl_direct=env_bool("HYBRID_EP_NIXL_DIRECT", True),
            nixl_progress_thread=env_bool("HYBRID_EP_NIXL_PROGRESS_THREAD", False),
            nvshmem_direct=env_bool("HYBRID_EP_NVSHMEM_DIRECT", True),
            combine_wire=env_choice("HYBRID_EP_COMBINE_WIRE", "bf16", ("bf16", "fp32")),
            p2p_wire=p2p_wire.parse(_raw("HYBRID_EP_P2P_WIRE")),
            prob_puts=env_choice("HYBRID_EP_PROB_PUTS", "run", ("run", "token")),
            eager=env_choice("HYBRID_EP_EAGER", "0", ("0", "1")) == "1",
            net_ring_chunks=net_ring_chunks_from_env(),
            fault=env_choice("HYBRID_EP_FAULT", "off", ("off", *FAULTS)),
            zero_copy=env_bool("HYBRID_EP_ZERO_COPY", True),
            zero_copy_pool_mb=env_int("HYBRID_EP_ZERO_COPY_POOL_MB", None, 1, 1 << 30),
        )


def effective_env() -> list[tuple[EnvVar, str, str | None]]:
    """Every declared variable, the value in effect (the environment's, else the default) and,
    for a malformed one, the error a HybridEPBuffer would raise (None otherwise)."""
    errors: dict[str, str] = {}
    removed: dict[str, str] = {}
    try:
        for _ in range(len(ENV_VARS) + 1):
            try:
                EnvSettings.read()
                break
            except ValueError as error:
                text = str(error)
                found = [(m.start(), v.name) for v in ENV_VARS
                         if (m := re.search(rf"\b{v.name}=", text)) and v.name not in removed]
                if not found:
                    raise
                name = min(found)[1]
                errors[name] = text
                removed[name] = os.environ.pop(name)
    finally:
        os.environ.update(removed)
    return [(v, os.environ.get(v.name, v.default), errors.get(v.name)) for v in ENV_VARS]


# Without max_num_of_tokens_for_experts the receive regions hold every token of up to this many
# ranks: W*T rows, the worst case (nothing is ever dropped), in groups of up to 64 ranks; past
# that 64*T rows, which a 64 x 8 job can allocate (docs/usage.md, "The receive cap").
DEFAULT_RECEIVE_SOURCES = 64


def receive_rows(world: int, tokens: int, max_num_of_tokens_for_experts: int | None) -> int:
    """Rows of a rank's in-domain receive regions: ``max_num_of_tokens_for_experts``, or the
    default (None), at most ``world * tokens`` (a rank receives each token at most once)."""
    if max_num_of_tokens_for_experts is None:
        return min(world, DEFAULT_RECEIVE_SOURCES) * tokens
    return min(max_num_of_tokens_for_experts, world * tokens)


@dataclass(frozen=True)
class HybridEPConfig:
    """The buffer's template; a handle carries a copy with the call's fields filled in."""

    buffer_id: int
    hidden_dim: int
    max_num_of_tokens_per_rank: int
    num_local_experts: int
    use_fp8: bool
    group_size: int
    num_of_ranks_per_node: int
    num_of_nodes: int
    num_sms_dispatch_api: int
    num_sms_combine_api: int
    num_sms_preprocessing_api: int
    num_blocks_permute: int | None
    num_blocks_unpermute: int | None
    num_of_tokens_per_chunk_dispatch_api: int
    num_of_tokens_per_chunk_combine_api: int
    num_of_tokens_per_chunk_preprocessing_api: int
    num_of_stages_dispatch_api: int
    num_of_stages_g2s_combine_api: int
    num_channels: int
    # The receive cap (the constructor's keyword): None, the default of receive_rows().
    max_num_of_tokens_for_experts: int | None = None
    # Template values set by update_template_config; the call's own values win.
    pad_multiple: int = 1
    fuse_permute_dispatch: bool = False
    # Per-call fields, filled in the config stored in a handle.
    with_permute: bool | None = None
    num_tokens: int | None = None
    num_dispatched_tokens: int | None = None
    # CUDA engine: rows [begin, end) of the dispatch order that are this rank's own tokens.
    own_rows: tuple[int, int] | None = None
    num_permuted_tokens: int | None = None
    non_blocking: bool | None = None
    # The buffer's count of the handle (CallStamp: ranks agree on the handle a call passes).
    handle_id: int | None = None

    @property
    def num_of_experts(self) -> int:
        return self.num_local_experts * self.group_size

    @property
    def received_rows(self) -> int:
        """Rows this buffer's receive regions hold (the cap in effect, see receive_rows)."""
        return receive_rows(self.group_size, self.max_num_of_tokens_per_rank,
                            self.max_num_of_tokens_for_experts)

    def layout_key(self) -> tuple:
        """Fields a handle must share with the buffer to be usable with it."""
        return (self.buffer_id, self.num_local_experts, self.group_size,
                self.num_of_ranks_per_node, self.num_of_nodes)

    def replace(self, **changes) -> HybridEPConfig:
        return dataclasses.replace(self, **changes)


CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(HybridEPConfig))
