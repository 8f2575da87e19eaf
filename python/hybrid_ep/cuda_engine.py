"""The CUDA engine: HybridEPBuffer's calls on CUDA tensors, run by the compiled core.

Each operation's flow is ``operations.Engine``'s; this class gives it the steps. Python allocates every output with torch and hands raw pointers and the current stream to
``hybrid_ep._C.Runtime``; the core never sees torch. Created on the first CUDA call (a
collective: every rank makes the same calls), it registers one buffer per rank and maps the
buffers of its NVLink domain through handles exchanged over the process group.
"""

from __future__ import annotations

import os
import socket
import warnings

import torch

from . import native, transport_bootstrap, transport_connect, transport_options
from .call_stamp import CallStamp
from .config import EnvSettings, HybridEPConfig
from .device_status import raise_for_status
from .engines import RECEIVED, NeedsGrowth
from .errors import HybridEPMismatchError, HybridEPTimeoutError
from .layouts import DispatchLayout, PermuteLayout, ceil_div
from .limits import check_limits
from .operations import Engine
from .registered_views import RegisteredViews, is_combine_region
from .topology import Topology
from .zero_copy import ZeroCopyPool, pool_bytes

__all__ = ["CudaEngine", "HybridEPMismatchError", "HybridEPTimeoutError", "fused_blocks"]

# The current stream's handle without building a torch.cuda.Stream: about 0.2 us where
# torch.cuda.current_stream() takes about 5, and the fused calls ask four times.
_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
# The fewest fused permute/unpermute blocks a default sizing gives, however many ranks share
# the GPU.
MIN_DEFAULT_FUSED_BLOCKS = 16


class StagedRows:
    """Dispatched rows left in the registered buffer for the permute kernel to gather."""

    def __init__(self, row_bytes: int, cols: int, dtype: torch.dtype, scale_cols: int,
                 with_probs: bool):
        self.row_bytes = row_bytes
        self.cols = cols
        self.dtype = dtype
        self.scale_cols = scale_cols
        self.with_probs = with_probs


class CudaEngine(Engine):
    name = "cuda"
    fuses = True

    def __init__(self, group, topo: Topology, config: HybridEPConfig, env: EnvSettings,
                 use_mnnvl: bool, rendezvous, eager: bool = False):
        check_limits(topo, config.max_num_of_tokens_per_rank, config.num_local_experts)
        self.group = group
        self.topo = topo
        self.env = env
        self.rendezvous = rendezvous  # bounded host exchanges (rendezvous.py)
        self.use_mnnvl = use_mnnvl
        self.eager = eager  # HYBRID_EP_EAGER in effect (HybridEPBuffer decides it once)
        self.experts = config.num_local_experts
        self.device = torch.device("cuda", torch.cuda.current_device())
        self._fresh_layout = False  # a blocking preprocess's summary is still to be read
        self._preprocessed = False  # the dispatch follows its preprocess (no barrier needed)
        self._summary_ready = torch.cuda.Event()
        self._expert_counts = torch.empty(config.num_local_experts, dtype=torch.int32,
                                          device="cpu", pin_memory=True)
        self._counts_pending = False
        self._sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        # MPS applies a thread percentage when the context is created; _sms is then the share.
        self._mps_share = bool(os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"))
        self._counters_before = None  # counters of runtimes replaced by grow()
        self._transport = None  # transport_connect.Connection of the runtime
        self._views = RegisteredViews()  # tensors of get_combine_input_buffer
        self.zero_copy = ZeroCopyPool(env.zero_copy)  # kept across grow(): its counts go on
        self._connect(config)

    # -- lifetime --------------------------------------------------------------------------------
    def _connect(self, config: HybridEPConfig) -> None:
        C = native.module()
        rc = C.RuntimeConfig()
        rc.world = self.topo.group_size
        rc.ranks = self.topo.ranks_per_domain
        rc.nodes = self.topo.num_of_nodes
        rc.node_rank = self.topo.node_rank
        rc.local_rank = self.topo.local_rank
        rc.experts_per_rank = config.num_local_experts
        rc.max_tokens = config.max_num_of_tokens_per_rank
        rc.max_received = config.received_rows
        rc.zero_copy_pool_bytes = pool_bytes(
            self.env.zero_copy, self.topo.num_of_nodes, self.env.zero_copy_pool_mb,
            config.received_rows, config.hidden_dim, config.num_local_experts,
            self.topo.ranks_per_domain)
        rc.hidden = config.hidden_dim
        rc.dispatch_chunk = config.num_of_tokens_per_chunk_dispatch_api
        rc.combine_chunk = config.num_of_tokens_per_chunk_combine_api
        rc.stages_dispatch = config.num_of_stages_dispatch_api
        rc.stages_combine = config.num_of_stages_g2s_combine_api
        rc.sms_dispatch = config.num_sms_dispatch_api
        rc.sms_combine = config.num_sms_combine_api
        rc.sms_preprocessing = config.num_sms_preprocessing_api
        rc.timeout_s = self.env.timeout_s
        rc.combine_pieces = self.env.combine_pieces
        rc.channels = self.env.num_channels
        rc.fabric = self.use_mnnvl
        rc.combine_wire_fp32 = self.env.combine_wire == "fp32"
        rc.prob_puts_per_token = self.env.prob_puts == "token"
        rc.net_ring_chunks = self.env.net_ring_chunks
        rc.eager = self.eager
        rc.withhold_dispatch_credits = self.env.fault == "withhold_dispatch_credits"
        rc.withhold_combine_credits = self.env.fault == "withhold_combine_credits"
        rc.stage_network_sources = self.env.fault == "stage_network_sources"
        transport_options.check_fault(C.build_info()["transport"], self.env.fault)
        rc.unmapped_peers = self.env.fault == "unmapped_peers"
        rc.transport_options = transport_options.runtime_options(
            C.build_info()["transport"], self.topo.num_of_nodes, self.env, config, self.device)
        rc.transport_options = {**rc.transport_options, **transport_bootstrap.group_options(
            C, self.group, self.topo.rank, rc, self.env)}
        self.config = config
        self.experts = config.num_local_experts
        self.runtime = C.Runtime(rc)
        self.zero_copy.attach(self.runtime)
        everyone = self.rendezvous.gather(
            "HybridEPBuffer (CUDA engine set-up)",
            (self.runtime.export_handle(), _gpu_identity(self.device)))
        gpu = everyone[self.topo.rank][1]
        self._ranks_on_gpu = sum(1 for _, other in everyone if other == gpu)
        first = self.topo.node_rank * self.topo.ranks_per_domain
        self.runtime.open_peers([h for h, _ in everyone[first:first + self.topo.ranks_per_domain]])
        offsets = self.runtime.layout_offsets()
        # (address, bytes) of this rank's combine region, and whether claim_combine_input
        # has run since the last combine (the next combine then skips its first barrier).
        self._combine_region = (self.runtime.registered_address() + offsets["combine_rows"],
                                offsets["combine_probs"] - offsets["combine_rows"])
        self._claimed = False
        # The transport reaches this rank's peer (same local rank) in every other domain.
        R = self.topo.ranks_per_domain
        peers = [n * R + self.topo.local_rank for n in range(self.topo.num_of_nodes)]
        self._transport = transport_connect.connect(
            self.runtime, C.build_info()["transport"], self.group, self.topo.rank, peers,
            self.env)

    def _release_runtime(self) -> None:
        """Collective (grow, close): frees the runtime's buffer after the GPU is done with it, on
        every rank together, which a collectively freed buffer (the nvshmem build's) needs. What
        the transport connection holds (the nixl build's views and registration) goes first,
        while the buffer still exists."""
        torch.cuda.synchronize(self.device)
        if self._transport is not None:
            connection, self._transport = self._transport, None
            connection.close()
        runtime, self.runtime = self.runtime, None
        if runtime is None:
            return
        # Decided together: a collectively freed buffer is freed by every rank or by none. Live
        # zero-copy tensors keep their rank's buffer (it goes with the last of them).
        pooled = runtime.pool_stats()["blocks"] > 0
        held = self.rendezvous.gather("HybridEPBuffer (release)",
                                      (self._views.of(runtime), pooled))
        if any(views for views, _ in held):
            warnings.warn("HybridEPBuffer: a tensor from get_combine_input_buffer still views "
                          "the registered buffer being replaced or destroyed; its memory is "
                          "freed when the last such tensor is", RuntimeWarning, stacklevel=4)
            return  # each rank's runtime goes with the last tensor viewing it
        if any(pooled for _, pooled in held):
            return  # each rank's buffer goes with its last zero-copy tensor (PoolArena)
        runtime.release()

    def grow(self, config: HybridEPConfig) -> None:
        """Collective: every rank replaces its registered buffer with a larger one."""
        torch.cuda.synchronize(self.device)
        self._counters_before = self.transport_counters()
        self._release_runtime()
        self._connect(config)

    def transport_counters(self) -> list[dict]:
        """Per channel {puts, signals, bytes} of this rank's data-path sends (dispatch and
        combine network legs) since the engine was built; a synchronous device read."""
        now = self.runtime.transport_counters()
        if self._counters_before is not None:
            for channel, before in zip(now, self._counters_before, strict=True):
                for key in channel:
                    channel[key] += before[key]
        return now

    def reset_transport_counters(self) -> None:
        self.runtime.reset_transport_counters()
        self._counters_before = None

    # Config fields the registered layout or the launches depend on (capacity fields aside).
    _LAUNCH_FIELDS = ("num_local_experts", "num_sms_dispatch_api", "num_sms_combine_api",
                      "num_sms_preprocessing_api", "num_of_tokens_per_chunk_dispatch_api",
                      "num_of_tokens_per_chunk_combine_api", "num_of_stages_dispatch_api",
                      "num_of_stages_g2s_combine_api")

    def matches(self, config: HybridEPConfig) -> bool:
        """False when the buffer must be rebuilt for ``config`` (more capacity, other launch
        parameters); the caller rebuilds at the next CUDA call, on every rank alike."""
        c = self.config
        return (c.max_num_of_tokens_per_rank >= config.max_num_of_tokens_per_rank
                and c.received_rows >= config.received_rows
                and c.hidden_dim >= config.hidden_dim
                and all(getattr(c, f) == getattr(config, f) for f in self._LAUNCH_FIELDS))

    def close(self) -> None:
        """Frees the registered buffer; peers must be done with it (see HybridEPBuffer.destroy)."""
        self._release_runtime()

    # -- checks ----------------------------------------------------------------------------------
    def agree(self, stamp: CallStamp, num_tokens: int) -> None:
        """The call's stamp, which the kernels of its first exchange (routing all-gather,
        barrier) compare with the peers' before data moves (no host exchange)."""
        self.runtime.begin_call(stamp.pack())

    def check_status(self) -> None:
        if self.runtime.status_code() == 0:
            return
        raise_for_status(self.runtime.status(), self.topo, self.env.timeout_s)

    def _row_bytes(self, hidden: torch.Tensor) -> int:
        row_bytes = hidden.shape[1] * hidden.element_size()
        if row_bytes > 2 * self.config.hidden_dim:
            raise ValueError(f"hidden: rows of {hidden.shape[1]} x {hidden.dtype} exceed the "
                             f"buffer's hidden_dim={self.config.hidden_dim}; call "
                             "update_template_config(hidden_dim=...) on every rank first")
        return row_bytes

    def _check_device(self, device: torch.device, name: str = "hidden") -> None:
        if device != self.device:
            raise ValueError(f"{name}: on {device}, but this buffer's CUDA engine lives on "
                             f"{self.device}; set torch.cuda.set_device before building the "
                             "buffer and keep every call's tensors there")

    def _stream(self) -> int:
        if _current_raw_stream is not None:
            return _current_raw_stream(self.device.index)
        return torch.cuda.current_stream(self.device).cuda_stream

    # -- preprocessing ---------------------------------------------------------------------------
    def preprocess(self, routing_map: torch.Tensor, tokens: int, blocking: bool = True,
                   expert_counts: bool = False, received: int | None = None):
        """Launches the routing all-gather and the metadata kernels. Blocking calls read the
        dispatched count (and, with ``expert_counts``, the rows per local expert that size a
        permuted output) at their one host synchronisation, after the dispatch launch; a
        non-blocking call never waits and leaves the count on the device. Rows past the
        buffer's receive cap (``received``, as the runtime was built with) are dropped on the
        device, and counted in the layout's ``dropped_rows``; a blocking call then grows."""
        self.check_status()
        if tokens != self.config.max_num_of_tokens_per_rank:
            raise RuntimeError(f"internal: preprocess for {tokens} tokens on a buffer of "
                               f"{self.config.max_num_of_tokens_per_rank}")
        self._check_device(routing_map.device)
        topo, T, E = self.topo, tokens, self.experts
        dev = self.device
        s2d = torch.empty(topo.num_of_nodes * T, topo.ranks_per_domain, dtype=torch.int32,
                          device=dev)
        r2a = torch.zeros(ceil_div(T, 16) * 16, topo.num_of_nodes, dtype=torch.bool, device=dev)
        a2r = torch.zeros(T, topo.num_of_nodes - 1, dtype=torch.bool, device=dev)
        ndt = torch.empty(1, dtype=torch.int32, device=dev)
        lerm = torch.zeros(T * topo.group_size, E, dtype=torch.bool, device=dev)
        chunks = ceil_div(T, self.config.num_of_tokens_per_chunk_dispatch_api)
        chunk_layout = torch.empty(topo.group_size * chunks + 1, dtype=torch.int32, device=dev)
        dropped = torch.empty(1, dtype=torch.int32, device=dev)
        rmap = routing_map.contiguous()
        self.runtime.preprocess(rmap.data_ptr(), rmap.shape[0], s2d.data_ptr(), r2a.data_ptr(),
                                a2r.data_ptr(), ndt.data_ptr(), lerm.data_ptr(),
                                chunk_layout.data_ptr(), dropped.data_ptr(), self._stream())
        self._counts_pending = blocking and expert_counts
        if self._counts_pending:
            self._expert_counts.copy_(lerm.sum(0, dtype=torch.int32), non_blocking=True)
        layout = DispatchLayout(s2d, r2a, a2r, ndt, lerm, None, dense_chunk_layout=chunk_layout,
                                dropped_rows=dropped)
        self._preprocessed = True
        if blocking:
            # The dispatched count and the token maximum are read after the dispatch kernel is
            # launched (see dispatch), so the host wait overlaps the data movement.
            self._summary_ready.record()
            self._fresh_layout = True
        return layout, None, tokens

    def _read_summary(self, layout: DispatchLayout) -> None:
        """Blocking mode's one host synchronisation: the output size, and whether some rank had
        more tokens than the buffer holds or was routed more rows than its receive regions hold
        (then the launched work used truncated but consistent layouts, and the caller grows and
        redoes the call)."""
        self._summary_ready.synchronize()
        self.check_status()
        dispatched, needed, own_begin, own_end, routed = self.runtime.summary()
        if needed > self.config.max_num_of_tokens_per_rank:
            raise NeedsGrowth(int(needed))
        cap = self.config.received_rows
        worst = self.topo.group_size * self.config.max_num_of_tokens_per_rank
        if self.topo.num_of_nodes > 1 and cap < worst:
            # Each domain counts the rows of its own ranks only (the gathered routing holds its
            # experts' bits): agree on the group's most on the host, so every domain grows
            # together. Only a cap below W x T can be outgrown, so only then.
            routed = max(self.rendezvous.gather("dispatch (receive cap)", int(routed)))
        if routed > cap:
            raise NeedsGrowth(int(routed), RECEIVED)
        layout.num_dispatched_tokens = int(dispatched)
        layout.own_rows = (int(own_begin), int(own_end))
        if self._counts_pending:
            layout.expert_counts = self._expert_counts.clone()
            self._counts_pending = False

    # -- dispatch / combine ----------------------------------------------------------------------
    def move_rows(self, hidden, probs, scaling_factor, layout: DispatchLayout, tokens: int,
                  keep_in_buffer: bool = False,
                  fused_permute: tuple[int, int | None] | None = None):
        """Rows to every destination's registered buffer; then copied out into new tensors, or
        (``keep_in_buffer``, the permute path) left there for the permute kernel. With a
        handle inside one domain, a rank's rows from itself go straight into the new tensors. With
        ``fused_permute`` = (pad_multiple, num_permuted_tokens or None) extra blocks of the
        dispatch grid write the expert-major rows as chunks arrive; returns those rows and the
        permuted layout."""
        self.check_status()
        self._check_device(hidden.device)
        row_bytes = self._row_bytes(hidden)
        if hidden.data_ptr() % 16 != 0:  # TMA copies need 16-byte aligned rows
            hidden = hidden.clone()
        scale_cols = scaling_factor.shape[1] if scaling_factor is not None else 0
        if self.topo.num_of_nodes > 1:
            # A rank without tokens still forwards its peers' probs and scales, which the
            # kernel keys on their pointers: an empty tensor has none, so give it storage.
            probs = _with_storage(probs)
            scaling_factor = _with_storage(scaling_factor)
        stream = self._stream()
        args = (hidden.data_ptr(), _ptr(probs), _ptr(scaling_factor),
                layout.sparse_to_dense_map.data_ptr(), layout.attn_to_rdma_map.data_ptr(), tokens,
                hidden.shape[0], row_bytes, scale_cols, not self._preprocessed)
        if fused_permute is not None:
            return self._dispatch_permute(args, hidden, probs is not None, scale_cols, layout,
                                          fused_permute)
        if (not keep_in_buffer and self.topo.num_of_nodes == 1
                and self.zero_copy.usable(self.runtime)):
            outputs = self._dispatch_zero_copy(args, hidden, probs, scaling_factor, layout,
                                               stream)
            if outputs is not None:
                return outputs
        # With the output's size known before the launch (a handle's), inside one domain, this
        # rank's rows from itself go straight into the output instead of through its buffer:
        # the copy out leaves them out (at one rank, all of it).
        direct = (not keep_in_buffer and not self._fresh_layout and layout.own_rows is not None
                  and self.topo.num_of_nodes == 1)
        outputs = (self._dispatch_outputs(layout.num_dispatched_tokens, hidden, probs,
                                          scaling_factor) if direct else (None, None, None))
        self.zero_copy.network_sent(
            self.runtime.dispatch(*args, *(_ptr(t) for t in outputs), 0, 0, 0, 0, stream))
        if self._fresh_layout:
            self._read_summary(layout)
        self._fresh_layout = False
        self._preprocessed = False
        if keep_in_buffer:
            staged = StagedRows(row_bytes, hidden.shape[1], hidden.dtype, scale_cols,
                                probs is not None)
            return staged, None, None
        rows = layout.num_dispatched_tokens
        if not direct:
            outputs = self._dispatch_outputs(rows, hidden, probs, scaling_factor)
        written = layout.own_rows if direct else (0, 0)
        self.runtime.copy_dispatched(*(_ptr(t) for t in outputs), rows, row_bytes,
                                     scale_cols, *written, stream)
        if rows:
            per_row = row_bytes + sum(t.shape[1] * 4 for t in outputs[1:] if t is not None)
            self.zero_copy.copied_dispatch((rows - (written[1] - written[0])) * per_row)
        return outputs

    def _dispatch_zero_copy(self, args, hidden, probs, scaling_factor, layout: DispatchLayout,
                            stream: int):
        """The dispatch into outputs of the zero-copy pool, which the peers store into: no
        copy out. The outputs are sized before the launch, so a blocking call with a fresh
        layout takes its one synchronisation first. None when the pool has no room (or there
        are no rows): the caller copies out as before."""
        if self._fresh_layout:
            self._fresh_layout = False
            self._read_summary(layout)
        rows = layout.num_dispatched_tokens
        if rows == 0:
            return None
        outputs = self.zero_copy.dispatch_outputs(
            self.runtime, self.device, rows, hidden.shape[1], hidden.dtype,
            self.experts * self.topo.ranks_per_domain if probs is not None else None,
            scaling_factor.shape[1] if scaling_factor is not None else None)
        if outputs is None:
            return None
        self._preprocessed = False
        self.runtime.dispatch(*args, 0, 0, 0, *(_ptr(t) for t in outputs), rows, stream)
        return outputs

    def _dispatch_outputs(self, rows: int, hidden, probs, scaling_factor):
        out = torch.empty(rows, hidden.shape[1], dtype=hidden.dtype, device=self.device)
        out_probs = None
        if probs is not None:
            out_probs = torch.empty(rows, self.experts * self.topo.ranks_per_domain,
                                    dtype=torch.float32, device=self.device)
        out_scales = None
        if scaling_factor is not None:
            out_scales = torch.empty(rows, scaling_factor.shape[1], dtype=torch.float32,
                                     device=self.device)
        return out, out_probs, out_scales

    def _dispatch_permute(self, args, hidden, with_probs: bool, scale_cols: int,
                          layout: DispatchLayout, fused_permute):
        """The fused dispatch_with_permute. The output is sized before the launch, so a
        blocking call takes its one synchronisation here, before the dispatch instead of after
        it."""
        pad_multiple, budget = fused_permute
        if self._fresh_layout:
            self._fresh_layout = False
            self._read_summary(layout)
        self._preprocessed = False
        plan = self.permute_plan(layout, pad_multiple, budget)
        if layout.dense_chunk_layout is None:
            raise RuntimeError("internal: the fused permute needs the handle's dense_chunk_layout")
        P = plan.num_permuted_tokens
        out = torch.empty(P, hidden.shape[1], dtype=hidden.dtype, device=self.device)
        out_probs = torch.empty(P, dtype=torch.float32, device=self.device) if with_probs else None
        out_scales = (torch.empty(P, scale_cols, dtype=torch.float32, device=self.device)
                      if scale_cols else None)
        blocks = self._fused_blocks(self.config.num_blocks_permute,
                                    self.config.num_sms_dispatch_api, "num_sms_dispatch_api")
        self.zero_copy.network_sent(self.runtime.dispatch_permute(
            *args, layout.dense_chunk_layout.data_ptr(), plan.dense_to_expert_map.data_ptr(),
            plan.row_source.data_ptr(), P, blocks, out.data_ptr(), _ptr(out_probs),
            _ptr(out_scales), self._stream()))
        return (out, out_probs, out_scales), plan

    def combine_rows(self, hidden, probs, layout: DispatchLayout, tokens: int, num_tokens: int):
        return self._combine(hidden, probs, layout, tokens, num_tokens, None)

    def combine_input(self, rows: int, cols: int, device: torch.device) -> torch.Tensor:
        """BF16 [rows, cols] over this rank's combine region, for the next combine's input;
        first, on the stream, the wait for the peers to finish pulling from that region."""
        self.check_status()
        self._check_device(device, "handle")
        if rows * cols * 2 > self._combine_region[1]:
            raise RuntimeError(f"internal: {rows} x {cols} BF16 rows exceed the combine region "
                               f"of {self._combine_region[1]} bytes")
        if not self._claimed:
            self.runtime.claim_combine_input(self._stream())
            self._claimed = True
        return self._views.rows(self.runtime, self._combine_region[0], rows, cols, self.device)

    def _fused_blocks(self, requested: int | None, kernel_sms: int, what: str) -> int:
        blocks = fused_blocks(requested, self._sms, kernel_sms, self._ranks_on_gpu,
                              mps_share=self._mps_share)
        if blocks == 0:
            raise ValueError(f"{what}={kernel_sms}: the fused permute/unpermute needs blocks "
                             f"besides the kernel's own on this GPU's {self._sms} SMs")
        return blocks

    def _combine(self, hidden, probs, layout: DispatchLayout, tokens: int, num_tokens: int,
                 dense_to_expert_map, fused: bool = False):
        """Both combines: rows in dispatch order, or (with ``dense_to_expert_map``) in permuted
        order, unpermuted into the registered buffer first, or (``fused``) by extra blocks of
        the combine grid while it runs."""
        self.check_status()
        self._check_device(hidden.device)
        if hidden.dtype != torch.bfloat16:
            raise ValueError(f"hidden: {hidden.dtype} rows; the CUDA combine takes BF16 rows")
        self._row_bytes(hidden)
        unpermute = dense_to_expert_map is not None
        claimed = self._claimed
        is_combine_region(self._combine_region, hidden, claimed, unpermute)
        self._claimed = False
        self._fresh_layout = False
        self._preprocessed = False
        out = torch.empty(num_tokens, hidden.shape[1], dtype=torch.bfloat16, device=self.device)
        out_probs = None
        if probs is not None:
            out_probs = torch.empty(num_tokens, self.experts * self.topo.group_size,
                                    dtype=torch.float32, device=self.device)
        # Inside one domain the kernel reads this rank's rows of its own tokens from `hidden`
        # itself (TMA: 16-byte aligned), so only the peers' rows are staged.
        own = (layout.own_rows if (layout.own_rows is not None and not unpermute
                                   and self.topo.num_of_nodes == 1
                                   and hidden.data_ptr() % 16 == 0) else (0, 0))
        staged = self.runtime.combine(
            hidden.data_ptr(), _ptr(probs), probs is not None, hidden.shape[0], hidden.shape[1],
            layout.sparse_to_dense_map.data_ptr(), layout.rdma_to_attn_map.data_ptr(),
            layout.attn_to_rdma_map.data_ptr(), tokens, num_tokens, out.data_ptr(),
            _ptr(out_probs), dense_to_expert_map.data_ptr() if unpermute else 0,
            layout.num_dispatched_tokens_tensor.data_ptr() if unpermute else 0, 2 * self._sms,
            layout.dense_chunk_layout.data_ptr() if fused else 0,
            self._fused_blocks(self.config.num_blocks_unpermute, self.config.num_sms_combine_api,
                               "num_sms_combine_api") if fused else 0,
            *own, claimed, self._stream())
        if not unpermute and hidden.shape[0] > 0:
            self.zero_copy.combined(staged)
        return out, out_probs

    def empty_zero_copy(self, shape: tuple, dtype: torch.dtype):
        """A tensor in the zero-copy pool (None when there is no room, or no pool)."""
        return self.zero_copy.empty(self.runtime, self.device, shape, dtype)

    # -- permute / unpermute ---------------------------------------------------------------------
    def permute_plan(self, layout: DispatchLayout, pad_multiple: int,
                     num_permuted_tokens: int | None) -> PermuteLayout:
        """The permuted layout, computed on the device by the permute-layout kernels. Blocking
        calls size the output from the rows per expert read at their one synchronisation (a
        reused handle reads them here) and get ``tokens_per_expert`` computed on the host;
        non-blocking calls never touch the host."""
        lerm = layout.local_expert_routing_map
        counts = layout.expert_counts
        if counts is None and num_permuted_tokens is None:  # blocking, with a reused handle
            counts = lerm.sum(0, dtype=torch.int32).cpu()
        padded = None
        if counts is not None:
            # One int per local expert: Python arithmetic, several times faster than CPU
            # tensor ops on so few values.
            padded = [ceil_div(int(c), pad_multiple) * pad_multiple for c in counts.tolist()]
        if num_permuted_tokens is None:
            num_permuted_tokens = sum(padded)
        rows, dev = lerm.shape[0], self.device
        d2e = torch.empty(rows, self.experts, dtype=torch.int32, device=dev)
        row_source = torch.empty(num_permuted_tokens, dtype=torch.int32, device=dev)
        raw = torch.empty(self.experts, dtype=torch.int32, device=dev)
        tokens_per_expert = torch.empty(self.experts, dtype=torch.int64, device=dev)
        overflow = torch.empty(1, dtype=torch.int32, device=dev)
        self.runtime.permute_layout(lerm.contiguous().data_ptr(), rows, pad_multiple,
                                    num_permuted_tokens, d2e.data_ptr(), row_source.data_ptr(),
                                    raw.data_ptr(), tokens_per_expert.data_ptr(),
                                    overflow.data_ptr(), 2 * self._sms, self._stream())
        if padded is not None:  # the host copy: no device read in blocking mode
            clipped, offset = [], 0
            for rows_of_expert in padded:  # each expert's padded rows that fit the output
                clipped.append(max(0, min(rows_of_expert, num_permuted_tokens - offset)))
                offset += rows_of_expert
            tokens_per_expert = torch.tensor(clipped, dtype=torch.int64, device="cpu")
        return PermuteLayout(dense_to_expert_map=d2e, raw_tokens_per_expert=raw,
                             padded_tokens_per_expert=tokens_per_expert,
                             num_permuted_tokens=num_permuted_tokens, overflow=overflow,
                             row_source=row_source)

    def permute(self, rows: StagedRows, probs, scaling_factor, plan: PermuteLayout):
        """Gathers the staged rows into expert-major order (zero rows for padding)."""
        P = plan.num_permuted_tokens
        out = torch.empty(P, rows.cols, dtype=rows.dtype, device=self.device)
        out_probs = (torch.empty(P, dtype=torch.float32, device=self.device)
                     if rows.with_probs else None)
        out_scales = (torch.empty(P, rows.scale_cols, dtype=torch.float32, device=self.device)
                      if rows.scale_cols else None)
        self.runtime.permute(plan.row_source.data_ptr(), P, rows.row_bytes, rows.scale_cols,
                             rows.with_probs, 2 * self._sms, out.data_ptr(), _ptr(out_probs),
                             _ptr(out_scales), self._stream())
        return out, out_probs, out_scales

    def unpermute_combine(self, hidden, probs, layout: DispatchLayout, dense_to_expert_map,
                          num_dispatched: int | None, tokens: int, num_tokens: int,
                          fused: bool = False):
        """Expert outputs in permuted order -> fp32 sums per dispatch row, written straight
        into the registered buffer (no rounding in between), then combine; ``fused``: by
        unpermute blocks of the combine grid, chunk by chunk."""
        if fused and layout.dense_chunk_layout is None:
            raise RuntimeError("internal: the fused unpermute needs the handle's "
                               "dense_chunk_layout")
        return self._combine(hidden, probs, layout, tokens, num_tokens,
                             dense_to_expert_map.contiguous(), fused=fused)


def fused_blocks(requested: int | None, sms: int, kernel_sms: int, ranks_on_gpu: int,
                 mps_share: bool) -> int:
    """Blocks of a fused permute/unpermute next to the kernel's own ``kernel_sms`` on a GPU
    with ``sms`` SMs: every block of the grid must be resident at once, so at most the SMs the
    kernel leaves (0: none fit). ``requested`` None: this rank's part of the GPU less the
    kernel's own SMs, at least MIN_DEFAULT_FUSED_BLOCKS; the fused op is bound by the blocks it
    has. Under an MPS thread percentage (``mps_share``) ``sms`` is this process's share
    already; otherwise the ranks on this GPU split it."""
    if requested is None:
        share = sms if mps_share else sms // ranks_on_gpu
        requested = max(MIN_DEFAULT_FUSED_BLOCKS, share - kernel_sms)
    return min(requested, max(0, sms - kernel_sms))


def _gpu_identity(device) -> str:
    """Which physical GPU this rank runs on: ranks on one GPU (MPS) share its SMs."""
    return f"{socket.gethostname()}/{torch.cuda.get_device_properties(device).uuid}"


def _ptr(tensor) -> int:
    return 0 if tensor is None else tensor.data_ptr()


def _with_storage(tensor):
    """``tensor``, or when it is empty (no data pointer) a one-row stand-in of its width."""
    if tensor is None or tensor.data_ptr() != 0:
        return tensor
    return torch.zeros(1, *tensor.shape[1:], dtype=tensor.dtype, device=tensor.device)
