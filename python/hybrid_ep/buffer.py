"""HybridEPBuffer: the public API (a drop-in for DeepEP's hybrid-ep class of the same name).

This class validates, normalises and orchestrates; engines move the data. CPU tensors run on
the pure-torch reference engine; CUDA tensors on the CUDA engine. Arguments accepted only for
drop-in compatibility: compat.py.
"""

from __future__ import annotations

import itertools
import warnings

import torch
import torch.distributed as dist

from . import compat
from . import handle as handles
from . import validation as v
from .call_stamp import CallStamp
from .collective import CONSTRUCTION, buffer_rendezvous, collective, on_reference_engine
from .config import CONFIG_FIELDS, EnvSettings, HybridEPConfig
from .engines import NeedsGrowth, select_engine
from .memory_plan import registered_bytes as _registered_bytes
from .reference import layout as layouts
from .reference import network
from .reference.engine import ReferenceEngine
from .topology import (
    Topology,
    check_ranks_per_domain,
    detect_ranks_per_domain,
    local_facts,
)

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
                 use_mnnvl=None):
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
                                 "num_local_experts": experts}
        everyone = self._rendezvous.gather(CONSTRUCTION, facts)
        self._call_agreed = True
        for key, arg in (("hidden_dim", "hidden_dim"), ("num_local_experts", "num_local_experts")):
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
        )
        self._reference = self._new_reference(experts)
        self._cuda_engine = None
        self._handles = itertools.count(1)  # ids of the handles this buffer makes (CallStamp)
        self._sends = network.TransportStats.with_channels(self.config.num_channels)

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
    def _new_reference(self, experts: int) -> ReferenceEngine:
        env = self._env
        return ReferenceEngine(self.group, self.topology, experts, self._rendezvous,
                               env.timeout_s, env.combine_wire, env.prob_puts)

    def _engine(self, hidden: torch.Tensor):
        engine = select_engine(self._env.engine, hidden.device, self._reference, self._cuda)
        self._call_engine = engine
        return engine

    def _agree(self, engine, stamp: CallStamp, rows: int) -> None:
        """The call's agreement (call_stamp.py), after every check of this rank's input: the
        reference engine exchanges the stamps on the host now; the CUDA engine hands its stamp
        to the routing all-gather and barriers its kernels start with."""
        engine.agree(stamp, rows)
        self._call_agreed = True

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
                                           self.use_mnnvl, self._rendezvous)
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

    def _grow_tokens(self, engine, needed: int) -> None:
        warnings.warn(f"HybridEPBuffer: growing max_num_of_tokens_per_rank from "
                      f"{self.config.max_num_of_tokens_per_rank} to {needed} (collective, slow); "
                      "size the buffer for the largest batch to avoid this", RuntimeWarning,
                      stacklevel=5)
        self.config = self.config.replace(max_num_of_tokens_per_rank=needed)
        engine.grow(self.config)

    def _preprocess(self, engine, routing_map: torch.Tensor, *, non_blocking: bool,
                    permute: bool):
        """Gather the routing and build the layout; blocking calls agree on the token maximum
        with the other ranks and grow the buffer collectively when a rank has more tokens."""
        while True:
            tokens = self.config.max_num_of_tokens_per_rank
            layout, routing, needed = engine.preprocess(routing_map, tokens,
                                                        blocking=not non_blocking,
                                                        expert_counts=permute)
            if needed <= tokens:
                return layout, routing, tokens
            # Every rank saw the same gathered counts, so every rank grows here together.
            self._grow_tokens(engine, needed)

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

    def _dispatch_rows(self, engine, *, hidden, scaling_factor, probs, routing_map, handle,
                       permute: bool, caller: str, non_blocking: bool, fused_permute=None,
                       fused: bool = False):
        """Agree on the call, preprocess (or reuse the handle), then move rows. Returns rows,
        layout, call config. With ``fused_permute`` (CUDA engine) the rows come back permuted,
        with their layout."""
        stamp = CallStamp(caller, engine=engine.name, fp8=v.is_fp8(hidden),
                          width=hidden.shape[1], probs=probs is not None,
                          scales=scaling_factor is not None, non_blocking=non_blocking,
                          fused=fused)
        if handle is not None:
            made = handles.check_handle(handle, self.config, permute=permute, caller=caller)
            v.check_handle_device(handle, hidden)
            if hidden.shape[0] != made.num_tokens:
                raise ValueError(f"hidden: {hidden.shape[0]} rows, but the handle was made for "
                                 f"{made.num_tokens} tokens on this rank")
            self._agree(engine, stamp.with_handle(made), hidden.shape[0])
            layout = handles.layout_from_handle(handle)
            tokens = handle[5] if not permute else handle[8]
            rows = self._move_rows(engine, hidden, probs, scaling_factor, layout, tokens,
                                   keep_in_buffer=permute, fused_permute=fused_permute)
            self._count_sends(engine, layout, tokens, hidden, probs, scaling_factor)
            return rows, layout, tokens, made, None
        self._agree(engine, stamp, hidden.shape[0])
        while True:
            layout, routing, tokens = self._preprocess(engine, routing_map.contiguous(),
                                                       non_blocking=non_blocking, permute=permute)
            try:
                rows = self._move_rows(engine, hidden, probs, scaling_factor, layout, tokens,
                                       keep_in_buffer=permute, fused_permute=fused_permute)
            except NeedsGrowth as growth:  # found by the CUDA engine after its launches
                self._grow_tokens(engine, growth.needed)
                continue
            self._count_sends(engine, layout, tokens, hidden, probs, scaling_factor)
            return rows, layout, tokens, None, routing

    def _count_sends(self, engine, layout, tokens, hidden, probs, scaling_factor) -> None:
        """The reference engine models the network leg's puts and signals (the CUDA engine's
        counters are read from the device)."""
        if engine is self._reference:
            engine.count_dispatch_sends(self._sends, self.config, layout, tokens, hidden, probs,
                                        scaling_factor)

    def _count_combine_sends(self, engine, layout, tokens, hidden, with_probs: bool) -> None:
        if engine is self._reference:
            engine.count_combine_sends(self._sends, self.config, layout, tokens, hidden,
                                       with_probs)

    def transport_stats(self, reset: bool = False) -> dict:
        """Network counters of this rank's sends since the buffer was built (or last reset):
        ``{"channels": [{"puts", "signals", "bytes"}, ...], "puts", "signals", "bytes"}``, one
        entry per channel (HYBRID_EP_NUM_CHANNELS). Dispatch's network leg: one put per maximal
        run of consecutive tokens per tensor (rows, probs, FP8 scales) and one signal per
        (chunk, destination domain); combine's: the same for the fp32 partial sums and partial
        probs going back. Calls inside one NVLink domain send nothing over the network. The CUDA
        engine reads its device counters (a synchronisation); the reference engine models them.
        Control traffic (barriers, the routing all-gather) is not counted."""
        sends = self._sends
        if self._cuda_engine is not None:
            sends = sends.plus(self._cuda_engine.transport_counters())
        stats = sends.as_dict()
        if reset:
            self._sends = network.TransportStats.with_channels(self.config.num_channels)
            if self._cuda_engine is not None:
                self._cuda_engine.reset_transport_counters()
        return stats

    def registered_bytes(self) -> int:
        """Bytes of this rank's registered buffer: the CUDA engine's, as allocated now (a grown
        buffer's new size); before a CUDA call allocates one, and on the reference engine,
        which registers nothing, ``hybrid_ep.memory_plan``'s total for the current config."""
        return _registered_bytes(self.config, self._env.combine_wire, self._cuda_engine)

    @staticmethod
    def _move_rows(engine, hidden, probs, scaling_factor, layout, tokens, *,
                   keep_in_buffer: bool, fused_permute=None):
        """The rows a rank receives; with ``keep_in_buffer`` an engine may leave them where the
        permute step reads them (the CUDA engine's registered buffer) instead of tensors."""
        extra = {"fused_permute": fused_permute} if fused_permute is not None else {}
        return engine.dispatch(hidden.contiguous(),
                               probs.contiguous() if probs is not None else None,
                               scaling_factor.contiguous() if scaling_factor is not None
                               else None, layout, tokens, keep_in_buffer=keep_in_buffer, **extra)

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
        (out, out_probs, out_scales), layout, tokens, made, _ = self._dispatch_rows(
            engine, hidden=hidden, scaling_factor=scaling_factor, probs=probs,
            routing_map=routing_map, handle=handle, permute=False, caller="dispatch",
            non_blocking=False)
        v.check_dispatched_count(num_dispatched_tokens, layout.num_dispatched_tokens)
        if num_dispatched_tokens_tensor is not None:
            num_dispatched_tokens_tensor.fill_(layout.num_dispatched_tokens)
        if made is None:
            call = self.config.replace(
                max_num_of_tokens_per_rank=tokens, with_permute=False,
                num_tokens=hidden.shape[0], num_dispatched_tokens=layout.num_dispatched_tokens,
                own_rows=layout.own_rows, non_blocking=False, handle_id=next(self._handles))
            handle = handles.make_dispatch_handle(layout, tokens, call, hidden.device)
        return out, out_probs, out_scales, handle

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
        self._agree(engine, CallStamp("combine", engine=engine.name, width=hidden.shape[1],
                                      probs=probs is not None).with_handle(made),
                    hidden.shape[0])
        layout = handles.layout_from_handle(handle)
        self._count_combine_sends(engine, layout, handle[5], hidden, probs is not None)
        return engine.combine(hidden.contiguous(),
                              probs.contiguous() if probs is not None else None,
                              layout, handle[5], made.num_tokens)

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
        self._agree(engine, CallStamp("get_combine_input_buffer", engine=engine.name,
                                      width=cols).with_handle(made), 0)
        return engine.combine_input(made.num_dispatched_tokens, cols, handle[0].device)

    def _check_combine_input(self, hidden, probs, rows: int, probs_shape: tuple):
        self._input_rows(hidden, allow_fp8=False)
        if hidden.shape[0] != rows:
            raise ValueError(f"hidden: expected {rows} rows (the handle's dispatched/permuted "
                             f"rows), got {v.describe(hidden)}")
        if probs is not None:
            v.require_tensor("probs", probs, dtypes=(torch.float32,), ndim=len(probs_shape),
                             shape=probs_shape, device=hidden.device)

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
        if handle is not None:
            made = handles.check_handle(handle, self.config, permute=True,
                                        caller="dispatch_with_permute")
            v.check_same("pad_multiple", pad, made.pad_multiple)
            v.check_same("fuse_permute_dispatch", fuse_permute_dispatch,
                        made.fuse_permute_dispatch)
            if budget is None:
                budget = made.num_permuted_tokens
        self._check_rows("hidden", hidden.shape[0], non_blocking=non_blocking)

        # The CUDA engine fuses the permute into the dispatch grid; the reference engine has
        # one way to compute the same outputs.
        fused = (pad, budget) if fuse_permute_dispatch and engine is self._cuda_engine else None
        moved, layout, tokens, made, routing = self._dispatch_rows(
            engine, hidden=hidden, scaling_factor=scaling_factor, probs=probs,
            routing_map=routing_map, handle=handle, permute=True,
            caller="dispatch_with_permute", non_blocking=non_blocking, fused_permute=fused,
            fused=fuse_permute_dispatch)
        if fused is not None:
            (out, out_probs, out_scales), plan = moved
        else:
            try:
                plan = engine.permute_plan(layout, pad, budget)
                out, out_probs, out_scales = engine.permute(*moved, plan)
            except BaseException:
                if engine is self._cuda_engine:
                    engine.release_received()  # see CudaEngine.release_received
                raise
        v.check_dispatched_count(num_dispatched_tokens, layout.num_dispatched_tokens)

        device = hidden.device
        if isinstance(plan.overflow, torch.Tensor):
            overflow = plan.overflow.to(device=device, dtype=torch.int32).reshape(1)
        else:
            overflow = torch.tensor([int(plan.overflow)], dtype=torch.int32, device=device)
        if handle is not None and plan.num_permuted_tokens == made.num_permuted_tokens:
            handle[10].copy_(overflow)
        else:
            if handle is not None:
                chunk_layout = handle[5]
            elif layout.dense_chunk_layout is not None:
                chunk_layout = layout.dense_chunk_layout
            else:
                chunk_layout = layouts.dense_chunk_layout(
                    routing, self.topology, self.config.num_local_experts,
                    self.config.num_of_tokens_per_chunk_dispatch_api)
            this_call = {"num_permuted_tokens": plan.num_permuted_tokens,
                         "non_blocking": non_blocking}
            # One replace per call: each copies the whole config.
            call = made.replace(**this_call) if made else self.config.replace(
                max_num_of_tokens_per_rank=tokens, with_permute=True, num_tokens=hidden.shape[0],
                num_dispatched_tokens=layout.num_dispatched_tokens, pad_multiple=pad,
                fuse_permute_dispatch=fuse_permute_dispatch, handle_id=next(self._handles),
                **this_call)
            handle = handles.make_permute_handle(
                layout, chunk_layout, plan.dense_to_expert_map, plan.raw_tokens_per_expert,
                tokens, call, overflow, device)
        tokens_per_expert = plan.padded_tokens_per_expert.to(torch.int64)
        if non_blocking:
            tokens_per_expert = tokens_per_expert.to(device)
        elif device.type == "cuda":
            tokens_per_expert = tokens_per_expert.cpu().pin_memory()
        return out, out_probs, out_scales, tokens_per_expert, handle

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
        self._agree(engine, CallStamp("combine_with_unpermute", engine=engine.name,
                                      width=hidden.shape[1], probs=probs is not None,
                                      fused=fuse_unpermute_combine).with_handle(made),
                    hidden.shape[0])
        layout = handles.layout_from_handle(handle)
        self._count_combine_sends(engine, layout, handle[8], hidden, probs is not None)
        # The CUDA engine fuses the unpermute into the combine grid; the reference engine has
        # one way to compute the same outputs.
        extra = ({"fused": True} if fuse_unpermute_combine and engine is self._cuda_engine
                 else {})
        return engine.unpermute_combine(hidden.contiguous(),
                                        probs.contiguous() if probs is not None else None,
                                        layout, handle[6], made.num_dispatched_tokens, handle[8],
                                        made.num_tokens, **extra)

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
        if num_local_experts is not None:
            experts = v.require_int("num_local_experts", num_local_experts, minimum=1)
            if experts != self.config.num_local_experts:
                changes["num_local_experts"] = experts
                self._reference = self._new_reference(experts)
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
                known = _TUNABLE_FIELDS + tuple(compat.UPDATE_TEMPLATE_CONFIG)
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
