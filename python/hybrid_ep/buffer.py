"""HybridEPBuffer: the public API (a drop-in for DeepEP's hybrid-ep class of the same name).

This class validates and normalises each call into one request (requests.py) and hands it to
the engine that runs the whole operation (operations.py): CPU tensors the pure-torch reference
engine, CUDA tensors the CUDA engine. Arguments accepted only for drop-in compatibility:
compat.py.
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

from . import compat, transport_options
from . import handle as handles
from . import validation as v
from .call_stamp import CallStamp
from .collective import CONSTRUCTION, buffer_rendezvous, collective, on_reference_engine
from .config import CONFIG_FIELDS, EnvSettings, HybridEPConfig
from .engines import select_engine
from .memory_plan import registered_bytes as _registered_bytes
from .reference import network
from .reference.engine import ReferenceEngine
from .requests import CombineInputRequest, CombineRequest, DispatchRequest, Request
from .topology import (
    Topology,
    check_ranks_per_domain,
    detect_ranks_per_domain,
    local_facts,
)
from .zero_copy import CopyStats

_BUFFER_IDS = itertools.count(1)
DEFAULT_SMS_DISPATCH = 16
DEFAULT_SMS_COMBINE = 16
DEFAULT_SMS_PREPROCESSING = 32
# Fields update_template_config accepts as keyword arguments beyond its named ones.
_TUNABLE_FIELDS = tuple(f for f in CONFIG_FIELDS if f.startswith(("num_sms", "num_blocks",
                                                                   "num_of_tokens_per_chunk",
                                                                   "num_of_stages")))


class HybridEPBuffer:
    @collective(CONSTRUCTION)
    def __init__(self, group, hidden_dim, max_num_of_tokens_per_rank, num_local_experts,
                 use_fp8=False, num_sms_dispatch_api=None, num_sms_combine_api=None,
                 num_sms_preprocessing_api=None, num_blocks_permute=None,
                 num_blocks_unpermute=None, load_cached_kernels=False, use_shared_buffer=True,
                 enable_custom_allgather=False, num_of_hybrid_ep_ranks_per_nvlink_domain=None,
                 use_mnnvl=None, max_num_of_tokens_for_experts=None):
        if not dist.is_initialized():
            raise RuntimeError("group: torch.distributed is not initialised; call "
                               "torch.distributed.init_process_group first")
        group = dist.group.WORLD if group is None else group
        env = EnvSettings.read()
        self._rendezvous = buffer_rendezvous(group, env.timeout_s)
        hidden_dim = v.require_int("hidden_dim", hidden_dim, minimum=1)
        if hidden_dim % v.BF16_ALIGN != 0:
            raise ValueError(f"hidden_dim={hidden_dim}: expected a multiple of {v.BF16_ALIGN}")
        max_tokens = v.require_int("max_num_of_tokens_per_rank", max_num_of_tokens_per_rank,
                                   minimum=1)
        experts = v.require_int("num_local_experts", num_local_experts, minimum=1)
        # The receive cap (docs/usage.md, "The receive cap"); None: the default.
        if max_num_of_tokens_for_experts is not None:
            max_num_of_tokens_for_experts = v.require_int(
                "max_num_of_tokens_for_experts", max_num_of_tokens_for_experts, minimum=1)
        if not isinstance(use_fp8, bool):
            raise TypeError(f"use_fp8: expected a bool, got {use_fp8!r}")
        if use_fp8 and hidden_dim % v.FP8_BLOCK != 0:
            raise ValueError(f"hidden_dim={hidden_dim}: use_fp8=True needs a multiple of "
                             f"{v.FP8_BLOCK} (one fp32 scale per {v.FP8_BLOCK} values)")
        self._env = env

        self.group = group
        self.rank = dist.get_rank(group)
        self.group_size = dist.get_world_size(group)
        # Construction is collective: agree on the shape of the problem and find the domains.
        facts = local_facts() | {"hidden_dim": hidden_dim, "max_tokens": max_tokens,
                                 "num_local_experts": experts,
                                 "max_num_of_tokens_for_experts": max_num_of_tokens_for_experts,
                                 "net_ring_chunks": env.net_ring_chunks,
                                 "zero_copy": env.zero_copy,
                                 "zero_copy_pool_mb": env.zero_copy_pool_mb,
                                 "eager": env.eager,
                                 # Why this rank's build cannot use the eager form here.
                                 "eager_blocked": (transport_options.eager_preconditions(
                                     transport_options.build_transport()) if env.eager else [])}
        everyone = self._rendezvous.gather(CONSTRUCTION, facts)
        self._call_agreed = True
        # The ring depth, the zero-copy pool and the receive cap shape every rank's layout,
        # which the peers address by offset, and every rank computes its domain's drops.
        for key, arg in (("hidden_dim", "hidden_dim"), ("num_local_experts", "num_local_experts"),
                         ("net_ring_chunks", "environment variable HYBRID_EP_NET_RING_CHUNKS"),
                         ("zero_copy", "environment variable HYBRID_EP_ZERO_COPY"),
                         ("zero_copy_pool_mb", "environment variable HYBRID_EP_ZERO_COPY_POOL_MB"),
                         ("eager", "environment variable HYBRID_EP_EAGER"),
                         ("max_num_of_tokens_for_experts", "max_num_of_tokens_for_experts")):
            values = [f[key] for f in everyone]
            if len(set(values)) != 1:
                raise ValueError(f"{arg}: ranks disagree ({values}); every rank must pass the "
                                 "same value")
        mnnvl = env.use_mnnvl if use_mnnvl is None else bool(use_mnnvl)
        if num_of_hybrid_ep_ranks_per_nvlink_domain is not None:
            ranks_per_domain = check_ranks_per_domain(
                num_of_hybrid_ep_ranks_per_nvlink_domain, self.group_size,
                "num_of_hybrid_ep_ranks_per_nvlink_domain")
        elif env.ranks_per_domain is not None:
            ranks_per_domain = check_ranks_per_domain(
                env.ranks_per_domain, self.group_size,
                "environment variable NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN")
        else:
            ranks_per_domain = detect_ranks_per_domain([f["host"] for f in everyone], mnnvl)
        self.topology = Topology(self.rank, self.group_size, ranks_per_domain)
        self.num_of_hybrid_ep_ranks_per_nvlink_domain = ranks_per_domain
        self.local_rank = self.topology.local_rank
        self.node_rank = self.topology.node_rank
        self.num_of_nodes = self.topology.num_of_nodes
        self.use_mnnvl = mnnvl
        # load_cached_kernels, use_shared_buffer, enable_custom_allgather: compat.CONSTRUCTOR.

        self.config = HybridEPConfig(
            buffer_id=next(_BUFFER_IDS),
            hidden_dim=hidden_dim,
            max_num_of_tokens_per_rank=max(f["max_tokens"] for f in everyone),
            num_local_experts=experts,
            use_fp8=use_fp8,
            group_size=self.group_size,
            num_of_ranks_per_node=ranks_per_domain,
            num_of_nodes=self.num_of_nodes,
            num_sms_dispatch_api=v.optional_positive("num_sms_dispatch_api", num_sms_dispatch_api,
                                           DEFAULT_SMS_DISPATCH),
            num_sms_combine_api=v.optional_positive("num_sms_combine_api", num_sms_combine_api,
                                          DEFAULT_SMS_COMBINE),
            num_sms_preprocessing_api=v.optional_positive("num_sms_preprocessing_api",
                                                num_sms_preprocessing_api,
                                                DEFAULT_SMS_PREPROCESSING),
            # None: the CUDA engine sizes the fused grids from this rank's part of the GPU.
            num_blocks_permute=v.optional_positive("num_blocks_permute", num_blocks_permute, None),
            num_blocks_unpermute=v.optional_positive("num_blocks_unpermute", num_blocks_unpermute, None),
            num_of_tokens_per_chunk_dispatch_api=env.tokens_per_chunk_dispatch,
            num_of_tokens_per_chunk_combine_api=env.tokens_per_chunk_combine,
            num_of_tokens_per_chunk_preprocessing_api=env.tokens_per_chunk_preprocessing,
            num_of_stages_dispatch_api=env.stages_dispatch,
            num_of_stages_g2s_combine_api=env.stages_g2s_combine,
            num_channels=env.num_channels,
            max_num_of_tokens_for_experts=max_num_of_tokens_for_experts,
        )
        # Decided once per buffer, for both engines (the reference engine models its counts).
        transport = transport_options.build_transport()
        self._eager = transport_options.eager_in_effect(
            transport, self.num_of_nodes, env.eager,
            failures={i: f["eager_blocked"] for i, f in enumerate(everyone)})
        if self._eager:
            transport_options.prepare_eager(transport)
        self._reference = self._new_reference(experts, self._new_sends())
        self._cuda_engine = None
        self._handles = itertools.count(1)  # ids of the handles this buffer makes (CallStamp)

    # -- attributes of the original class ------------------------------------------------------
    @property
    def hidden_dim(self) -> int:
        return self.config.hidden_dim

    @property
    def max_num_of_tokens_per_rank(self) -> int:
        return self.config.max_num_of_tokens_per_rank

    @property
    def num_local_experts(self) -> int:
        return self.config.num_local_experts

    @property
    def num_of_experts(self) -> int:
        return self.config.num_of_experts

    @property
    def use_fp8(self) -> bool:
        return self.config.use_fp8

    def __repr__(self) -> str:
        c = self.config
        return (f"HybridEPBuffer(rank={self.rank}/{self.group_size}, domains={self.num_of_nodes}"
                f"x{self.num_of_hybrid_ep_ranks_per_nvlink_domain}, hidden={c.hidden_dim}, "
                f"max_tokens={c.max_num_of_tokens_per_rank}, experts/rank={c.num_local_experts})")

    # -- shared steps ----------------------------------------------------------------------------
    def _new_reference(self, experts: int, sends: network.TransportStats) -> ReferenceEngine:
        env = self._env
        return ReferenceEngine(self.group, self.topology, experts, self._rendezvous, sends,
                               env.timeout_s, env.combine_wire, env.prob_puts, self._eager)

    def _new_sends(self) -> network.TransportStats:
        return network.TransportStats.with_channels(self.config.num_channels)

    def _engine(self, hidden: torch.Tensor):
        engine = select_engine(self._env.engine, hidden.device, self._reference, self._cuda)
        self._call_engine = engine
        return engine

    def _run(self, operation, request: Request):
        """The engine's ``operation`` on ``request``; then what the call changed here: whether
        its agreement ran (collective.py) and the template, which growth replaces."""
        try:
            return operation(request)
        finally:
            self._call_agreed = request.agreed
            self.config = request.config

    def _note_failure(self, op: str, error: BaseException, args, kwargs) -> None:
        """This rank raised on its input before the call's agreement (collective.py): where its
        peers wait for it on the host -- construction, the reference engine -- leave them the
        message. The CUDA engine's peers wait on the GPU and report a timeout naming this rank."""
        rendezvous = getattr(self, "_rendezvous", None)
        if rendezvous is None:  # before the rendezvous (a malformed variable): alike everywhere
            return
        if op == CONSTRUCTION or on_reference_engine(self._env.engine, self._call_engine,
                                                     self._reference, args, kwargs):
            rendezvous.note_failure(op, error)

    def _cuda(self):
        """The CUDA engine, created by the first CUDA call (collective) and rebuilt when the
        template outgrew it."""
        engine = self._cuda_engine
        if engine is None:
            from .cuda_engine import CudaEngine

            self._cuda_engine = CudaEngine(self.group, self.topology, self.config, self._env,
                                           self.use_mnnvl, self._rendezvous, eager=self._eager)
        elif engine.config is not self.config and not engine.matches(self.config):
            # (The same config object: nothing changed since the engine was built for it, and
            # the field-by-field check cost microseconds of every call.)
            engine.grow(self.config)
        return self._cuda_engine

    def _check_rows(self, name: str, rows: int, *, non_blocking: bool):
        if non_blocking and rows > self.config.max_num_of_tokens_per_rank:
            raise ValueError(f"{name}: {rows} tokens exceed the buffer maximum of "
                             f"{self.config.max_num_of_tokens_per_rank} per rank; a non-blocking "
                             "call cannot grow the buffer (raise max_num_of_tokens_per_rank, or "
                             "call once in blocking mode)")

    def _input_rows(self, hidden, *, allow_fp8: bool, use_fp8=None):
        is_fp8 = v.check_hidden(hidden, allow_fp8=allow_fp8)
        if use_fp8 is not None and bool(use_fp8) != is_fp8:
            raise ValueError(f"use_fp8={use_fp8}: hidden is {hidden.dtype}; expected "
                             f"use_fp8={is_fp8} or None")
        # One check for both engines: rows up to the buffer's width (narrower ones are fine).
        if hidden.shape[1] > self.config.hidden_dim:
            raise ValueError(f"hidden: {hidden.shape[1]} columns exceed the buffer's hidden_dim="
                             f"{self.config.hidden_dim} (got {v.describe(hidden)}); call "
                             "update_template_config(hidden_dim=...) on every rank first")
        return is_fp8

    def _dispatch_request(self, engine, *, hidden, scaling_factor, probs, handle, made,
                          caller: str, non_blocking: bool, routing_map, num_dispatched_tokens,
                          num_dispatched_tokens_tensor=None, fused: bool = False,
                          pad_multiple: int = 1, num_permuted_tokens=None) -> DispatchRequest:
        """The request of a dispatch whose arguments are checked (``made``: the handle's
        config)."""
        if handle is not None:
            v.check_handle_device(handle, hidden)
            if hidden.shape[0] != made.num_tokens:
                raise ValueError(f"hidden: {hidden.shape[0]} rows, but the handle was made "
                                 f"for {made.num_tokens} tokens on this rank")
        # The handle's id in the one construction: dataclasses.replace cost ~2 us per call.
        stamp = CallStamp(caller, engine=engine.name, fp8=v.is_fp8(hidden),
                          width=hidden.shape[1], probs=probs is not None,
                          scales=scaling_factor is not None,
                          handle=(made.handle_id or 0) if made is not None else 0,
                          non_blocking=non_blocking, fused=fused)
        return DispatchRequest(
            stamp=stamp, config=self.config,
            handle=handle, made=made, hidden=hidden.contiguous(),
            probs=probs.contiguous() if probs is not None else None,
            scaling_factor=scaling_factor.contiguous() if scaling_factor is not None else None,
            routing_map=routing_map, handle_ids=self._handles, non_blocking=non_blocking,
            num_dispatched_tokens=num_dispatched_tokens,
            num_dispatched_tokens_tensor=num_dispatched_tokens_tensor, pad_multiple=pad_multiple,
            num_permuted_tokens=num_permuted_tokens, fuse=fused)

    def transport_stats(self, reset: bool = False) -> dict:
        """Network counters of this rank's sends since the buffer was built (or last reset):
        ``{"channels": [{"puts", "signals", "bytes", "eager_tiles"}, ...], "puts", "signals",
        "bytes", "eager_tiles"}``, one entry per channel (HYBRID_EP_NUM_CHANNELS). Dispatch's
        network leg: one put per maximal run of consecutive tokens per tensor (rows, probs, FP8
        scales) and one signal per (chunk, destination domain), or in the eager form
        (HYBRID_EP_EAGER=1) one put per (chunk, domain) with tokens, its 4 KiB tiles counted as
        eager_tiles and no signal; combine's: the same as dispatch's (signalled, or eager) for
        the partial sums and partial probs going back. Calls inside one NVLink domain send nothing over the
        network. The CUDA engine reads its device counters (a synchronisation); the reference
        engine models them. Control traffic (barriers, the routing all-gather) is not counted."""
        sends = self._reference.sends
        if self._cuda_engine is not None:
            sends = sends.plus(self._cuda_engine.transport_counters())
        stats = sends.as_dict()
        if reset:
            self._reference.sends = self._new_sends()
            if self._cuda_engine is not None:
                self._cuda_engine.reset_transport_counters()
        return stats

    def dropped_rows(self) -> torch.Tensor:
        """int32 ``[1]``: rows routed to this rank that its receive cap
        (``max_num_of_tokens_for_experts``) dropped in its last dispatch that built a layout
        (a call without a handle): on the CUDA engine on that call's GPU, on the reference
        engine on the CPU. Only a non-blocking call drops (a blocking one grows the buffer
        instead and leaves 0); the count stays on the device, so reading it (``.item()``)
        synchronises. A zero CPU tensor before any dispatch."""
        engine = getattr(self, "_call_engine", None)
        dropped = getattr(engine, "dropped_rows", None)
        return dropped if dropped is not None else torch.zeros(1, dtype=torch.int32)

    def registered_bytes(self) -> int:
        """Bytes of this rank's registered buffer: the CUDA engine's, as allocated now (a grown
        buffer's new size); before a CUDA call allocates one, and on the reference engine,
        which registers nothing, ``hybrid_ep.memory_plan``'s total for the current config."""
        return _registered_bytes(self.config, self._env.combine_wire, self._cuda_engine)

    def copy_stats(self, reset: bool = False) -> dict:
        """What this rank's CUDA calls copied (docs/zero-copy.md): ``dispatch_zero_copy`` and
        ``dispatch_copied`` count dispatches whose outputs the peers wrote in place and those
        copied out of the registered buffer (``dispatch_bytes_copied``); ``combine_zero_copy``
        and ``combine_staged`` count plain combines whose input was read in place and those
        that staged it (``combine_bytes_staged``); ``pool_fallbacks`` counts calls that wanted
        the zero-copy pool but found no room; with several domains and a backend whose puts read
        only registered memory (doca; nixl and nvshmem towards unmapped peers),
        ``network_staged`` counts dispatches that copied their rows into the registered buffer
        for the network (``network_bytes_staged``), which a ``hidden`` from ``empty_zero_copy``
        avoids. Host counts, no synchronisation. Zeros on the reference engine (it moves tensors
        with torch) and before the first CUDA call."""
        engine = self._cuda_engine
        if engine is None:
            return CopyStats().as_dict()
        stats = engine.zero_copy.stats.as_dict()
        if reset:
            engine.zero_copy.stats = CopyStats()
        return stats

    def empty_zero_copy(self, *size, dtype=torch.bfloat16, device=None) -> torch.Tensor:
        """An uninitialised tensor of ``size`` in this rank's zero-copy pool, on this buffer's
        GPU: a later ``combine`` given it (e.g. the expert outputs written into it) lets the
        peers read it in place instead of staging it; with several domains, a dispatch's
        ``hidden`` (or FP8 ``scaling_factor``) in it is what the network's puts read, with no
        copy into the registered buffer first. An ordinary tensor: the pool block returns when
        the tensor and its views are freed. Where the pool cannot serve it (no room, counted in
        ``copy_stats``; several domains without HYBRID_EP_ZERO_COPY_POOL_MB; HYBRID_EP_ZERO_COPY=0;
        before the first CUDA call, which builds the pool; CUDA-graph capture) it is a plain
        ``torch.empty`` on ``device`` (default: the buffer's GPU, else the current CUDA
        device). Local: no peer takes part."""
        if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
            size = tuple(size[0])
        shape = tuple(v.require_int(f"size[{i}]", n, minimum=0) for i, n in enumerate(size))
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype: {dtype!r}; expected a torch.dtype")
        engine = self._cuda_engine
        on_engine = engine is not None and (device is None or torch.device(device) == engine.device)
        tensor = engine.empty_zero_copy(shape, dtype) if on_engine else None
        if tensor is not None:
            return tensor
        if device is None:
            device = engine.device if engine is not None else torch.device("cuda")
        return torch.empty(shape, dtype=dtype, device=device)

    # -- dispatch / combine ----------------------------------------------------------------------
    @collective("dispatch")
    def dispatch(self, hidden, scaling_factor=None, topk_idx=None, topk_weights=None,
                 num_of_experts=None, probs=None, routing_map=None,
                 num_dispatched_tokens_tensor=None, num_dispatched_tokens=None, handle=None):
        is_fp8 = self._input_rows(hidden, allow_fp8=True)
        engine = self._engine(hidden)
        scaling_factor = v.check_scaling_factor(scaling_factor, hidden, is_fp8)
        routing_map, probs = v.resolve_routing(
            hidden=hidden, routing_map=routing_map, probs=probs, topk_idx=topk_idx,
            topk_weights=topk_weights, num_of_experts=num_of_experts,
            expected_experts=self.config.num_of_experts, has_handle=handle is not None)
        if num_dispatched_tokens_tensor is not None:
            v.require_tensor("num_dispatched_tokens_tensor", num_dispatched_tokens_tensor,
                             dtypes=(torch.int32,), ndim=1, shape=(1,))
        made = (handles.check_handle(handle, self.config, permute=False, caller="dispatch")
                if handle is not None else None)
        request = self._dispatch_request(
            engine, hidden=hidden, scaling_factor=scaling_factor, probs=probs, handle=handle,
            made=made, caller="dispatch", non_blocking=False, routing_map=routing_map,
            num_dispatched_tokens=num_dispatched_tokens,
            num_dispatched_tokens_tensor=num_dispatched_tokens_tensor)
        return self._run(engine.dispatch, request)

    @collective("combine")
    def combine(self, hidden, probs=None, handle=None):
        if handle is None:
            raise ValueError("handle: required; pass the handle returned by dispatch")
        made = handles.check_handle(handle, self.config, permute=False, caller="combine")
        if isinstance(hidden, torch.Tensor):
            v.check_handle_device(handle, hidden)
        self._check_combine_input(hidden, probs, made.num_dispatched_tokens,
                                  probs_shape=(made.num_dispatched_tokens,
                                               self.config.num_local_experts
                                               * self.num_of_hybrid_ep_ranks_per_nvlink_domain))
        engine = self._engine(hidden)
        stamp = CallStamp("combine", engine=engine.name, width=hidden.shape[1],
                          probs=probs is not None)
        return self._run(engine.combine, self._combine_request(stamp, hidden, probs, handle, made))

    @collective("get_combine_input_buffer")
    def get_combine_input_buffer(self, handle, hidden_dim=None) -> torch.Tensor:
        """A BF16 ``[dispatched rows, hidden_dim]`` tensor in this rank's registered buffer
        (CUDA engine) for the expert outputs of ``handle``'s combine: ``combine`` reads it where
        it is instead of copying its input there first. Collective, like ``combine``: every rank
        calls it before that combine. It waits, on the current stream, until the peers are done
        with the region, so write into it on that stream after this call; it serves the next
        combine only (call again for the one after), and later combines overwrite it."""
        if handle is None:
            raise ValueError("handle: required; pass the handle returned by dispatch")
        made = handles.check_handle(handle, self.config, permute=False,
                                    caller="get_combine_input_buffer")
        cols = self.config.hidden_dim
        if hidden_dim is not None:
            cols = v.require_int("hidden_dim", hidden_dim, minimum=1)
            if cols % v.BF16_ALIGN != 0 or cols > self.config.hidden_dim:
                raise ValueError(f"hidden_dim={cols}: expected a multiple of {v.BF16_ALIGN} "
                                 f"up to the buffer's hidden_dim={self.config.hidden_dim}")
        engine = self._engine(handle[0])
        stamp = CallStamp("get_combine_input_buffer", engine=engine.name, width=cols)
        request = CombineInputRequest(stamp=stamp.with_handle(made), config=self.config,
                                      handle=handle, made=made,
                                      rows=made.num_dispatched_tokens, cols=cols,
                                      device=handle[0].device)
        return self._run(engine.get_combine_input_buffer, request)

    def _check_combine_input(self, hidden, probs, rows: int, probs_shape: tuple):
        self._input_rows(hidden, allow_fp8=False)
        if hidden.shape[0] != rows:
            raise ValueError(f"hidden: expected {rows} rows (the handle's dispatched/permuted "
                             f"rows), got {v.describe(hidden)}")
        if probs is not None:
            v.require_tensor("probs", probs, dtypes=(torch.float32,), ndim=len(probs_shape),
                             shape=probs_shape, device=hidden.device)

    def _combine_request(self, stamp: CallStamp, hidden, probs, handle, made,
                         fuse: bool = False) -> CombineRequest:
        return CombineRequest(stamp=stamp.with_handle(made), config=self.config, handle=handle,
                              made=made, hidden=hidden.contiguous(),
                              probs=probs.contiguous() if probs is not None else None, fuse=fuse)

    # -- permuted variants -----------------------------------------------------------------------
    @collective("dispatch_with_permute")
    def dispatch_with_permute(self, *, hidden, topk_idx=None, topk_weights=None,
                              num_of_experts_per_rank=None, num_of_experts=None, use_fp8=None,
                              routing_map=None, probs=None, scaling_factor=None,
                              num_permuted_tokens=None, pad_multiple=None, handle=None,
                              non_blocking=False, fuse_permute_dispatch=False,
                              num_dispatched_tokens=None, use_host_meta=None):
        is_fp8 = self._input_rows(hidden, allow_fp8=True, use_fp8=use_fp8)
        engine = self._engine(hidden)
        if num_of_experts_per_rank is not None:
            per_rank = v.require_int("num_of_experts_per_rank", num_of_experts_per_rank,
                                     minimum=1)
            if per_rank != self.config.num_local_experts:
                raise ValueError(f"num_of_experts_per_rank={per_rank}: the buffer has "
                                 f"{self.config.num_local_experts} local experts")
        scaling_factor = v.check_scaling_factor(scaling_factor, hidden, is_fp8)
        routing_map, probs = v.resolve_routing(
            hidden=hidden, routing_map=routing_map, probs=probs, topk_idx=topk_idx,
            topk_weights=topk_weights, num_of_experts=num_of_experts,
            expected_experts=self.config.num_of_experts, has_handle=handle is not None,
            non_blocking=non_blocking)
        pad = v.normalize_pad_multiple(pad_multiple)
        v.check_flag("non_blocking", non_blocking)
        v.check_flag("fuse_permute_dispatch", fuse_permute_dispatch)
        compat.check_use_host_meta(use_host_meta)
        budget = None
        if num_permuted_tokens is not None:
            budget = v.require_int("num_permuted_tokens", num_permuted_tokens)
            if budget % pad != 0:
                raise ValueError(f"num_permuted_tokens={budget}: expected a multiple of "
                                 f"pad_multiple={pad}")
        elif non_blocking:
            raise ValueError("num_permuted_tokens: required with non_blocking=True (it sizes the "
                             "output without a host synchronisation)")
        made = None
        if handle is not None:
            made = handles.check_handle(handle, self.config, permute=True,
                                        caller="dispatch_with_permute")
            v.check_same("pad_multiple", pad, made.pad_multiple)
            v.check_same("fuse_permute_dispatch", fuse_permute_dispatch,
                         made.fuse_permute_dispatch)
            if budget is None:
                budget = made.num_permuted_tokens
        self._check_rows("hidden", hidden.shape[0], non_blocking=non_blocking)
        request = self._dispatch_request(
            engine, hidden=hidden, scaling_factor=scaling_factor, probs=probs, handle=handle,
            made=made, caller="dispatch_with_permute", non_blocking=non_blocking,
            fused=fuse_permute_dispatch, routing_map=routing_map,
            num_dispatched_tokens=num_dispatched_tokens, pad_multiple=pad,
            num_permuted_tokens=budget)
        return self._run(engine.dispatch_with_permute, request)

    @collective("combine_with_unpermute")
    def combine_with_unpermute(self, *, hidden, probs=None, handle=None, pad_multiple=None,
                               fuse_unpermute_combine=False, num_dispatched_tokens=None):
        if handle is None:
            raise ValueError("handle: required; pass the handle returned by "
                             "dispatch_with_permute")
        made = handles.check_handle(handle, self.config, permute=True,
                                    caller="combine_with_unpermute")
        if isinstance(hidden, torch.Tensor):
            v.check_handle_device(handle, hidden)
        v.check_flag("fuse_unpermute_combine", fuse_unpermute_combine)
        v.check_same("pad_multiple", v.normalize_pad_multiple(pad_multiple), made.pad_multiple)
        v.check_same("fuse_unpermute_combine", fuse_unpermute_combine, made.fuse_permute_dispatch,
                    made_with="fuse_permute_dispatch")
        v.check_dispatched_count(num_dispatched_tokens, made.num_dispatched_tokens)
        self._check_combine_input(hidden, probs, made.num_permuted_tokens,
                                  probs_shape=(made.num_permuted_tokens,))
        engine = self._engine(hidden)
        stamp = CallStamp("combine_with_unpermute", engine=engine.name, width=hidden.shape[1],
                          probs=probs is not None, fused=fuse_unpermute_combine)
        return self._run(engine.combine_with_unpermute,
                         self._combine_request(stamp, hidden, probs, handle, made,
                                               fuse=fuse_unpermute_combine))

    # -- configuration ---------------------------------------------------------------------------
    def update_template_config(self, hidden_dim=None, num_of_tokens_per_rank=None,
                               num_local_experts=None, pad_multiple=None, use_fp8=None,
                               fuse_permute_dispatch=False, **kwargs):
        """Update the template every later call starts from; capacity only grows.

        Call it on every rank with the same arguments. Changing ``num_local_experts`` changes
        the expert layout, so handles made before it are refused afterwards.
        """
        changes = {}
        if hidden_dim is not None:
            hidden_dim = v.require_int("hidden_dim", hidden_dim, minimum=1)
            if hidden_dim % v.BF16_ALIGN != 0:
                raise ValueError(f"hidden_dim={hidden_dim}: expected a multiple of "
                                 f"{v.BF16_ALIGN}")
            changes["hidden_dim"] = max(hidden_dim, self.config.hidden_dim)
        if num_of_tokens_per_rank is not None:
            tokens = v.require_int("num_of_tokens_per_rank", num_of_tokens_per_rank, minimum=1)
            changes["max_num_of_tokens_per_rank"] = max(tokens,
                                                        self.config.max_num_of_tokens_per_rank)
        cap = kwargs.pop("max_num_of_tokens_for_experts", None)
        if cap is not None:
            cap = v.require_int("max_num_of_tokens_for_experts", cap, minimum=1)
            if cap > self.config.received_rows:  # capacity only grows
                changes["max_num_of_tokens_for_experts"] = cap
        if num_local_experts is not None:
            experts = v.require_int("num_local_experts", num_local_experts, minimum=1)
            if experts != self.config.num_local_experts:
                changes["num_local_experts"] = experts
                self._reference = self._new_reference(experts, self._reference.sends)
        if pad_multiple is not None:
            changes["pad_multiple"] = v.normalize_pad_multiple(pad_multiple)
        if use_fp8 is not None:
            v.check_flag("use_fp8", use_fp8)
            changes["use_fp8"] = use_fp8
        v.check_flag("fuse_permute_dispatch", fuse_permute_dispatch)
        changes["fuse_permute_dispatch"] = fuse_permute_dispatch
        for key, value in kwargs.items():
            if compat.check_template_kwarg(key, value):
                continue
            if key not in _TUNABLE_FIELDS:
                known = (_TUNABLE_FIELDS + ("max_num_of_tokens_for_experts",)
                         + tuple(compat.UPDATE_TEMPLATE_CONFIG))
                raise TypeError(f"update_template_config: unknown argument {key!r}; expected one "
                                f"of {', '.join(known)}")
            changes[key] = v.require_int(key, value, minimum=1)
        self.config = self.config.replace(**changes)
        return self.config

    def destroy(self) -> None:
        """Collective release of the GPU buffers: every rank waits for its GPU work, then for
        the other ranks, so no peer still reads this rank's memory when it is freed. Dropping
        the last reference without it frees this rank's memory at garbage collection, which is
        safe only when no peer can still be in an operation."""
        if self._cuda_engine is not None:
            torch.cuda.synchronize(self._cuda_engine.device)
            self._rendezvous.barrier("destroy")
            self._cuda_engine.close()
            self._cuda_engine = None

    def empty_jit_cache(self):
        """Does nothing: no kernel is compiled at run time (compat.METHODS)."""
