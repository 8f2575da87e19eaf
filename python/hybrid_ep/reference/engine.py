"""The pure-torch reference engine: exact semantics over any process group, on any device.

It is the oracle of every CUDA test and what ``HybridEPBuffer`` runs on CPU tensors. Each
operation's flow is ``operations.Engine``'s; this class gives it the steps, from inputs the
buffer validated and normalised (contiguous, routing as a bool map).
"""

from __future__ import annotations

import torch

from ..call_stamp import CallStamp, mismatch_message
from ..engines import RECEIVED, NeedsGrowth
from ..errors import HybridEPMismatchError
from ..operations import Engine
from ..topology import Topology
from . import layout as layouts
from . import movement, network
from .comm import CallGroup, all_gather_rows


class ReferenceEngine(Engine):
    name = "reference"

    def __init__(self, group, topo: Topology, experts_per_rank: int, rendezvous,
                 sends: network.TransportStats, timeout_s: float = 30.0,
                 combine_wire: str = "bf16", prob_puts: str = "run", eager: bool = False):
        # Every collective of a call is bounded by HYBRID_EP_TIMEOUT_S (comm.CallGroup).
        self.group = CallGroup(group, timeout_s)
        self.topo = topo
        self.experts = experts_per_rank
        self.rendezvous = rendezvous
        self.combine_wire = combine_wire  # HYBRID_EP_COMBINE_WIRE: partials between domains
        self.prob_puts = prob_puts  # HYBRID_EP_PROB_PUTS: run or token
        self.eager = eager  # HYBRID_EP_EAGER in effect: the eager form between domains
        self.sends = sends  # the modelled network sends (HybridEPBuffer.transport_stats)
        self._largest_tokens = None  # of the call under way, from its agreement

    # -- the agreement every call starts with --------------------------------------------------
    def agree(self, stamp: CallStamp, num_tokens: int) -> None:
        """The call's first exchange (bounded, rendezvous.py): every rank's stamp and token
        count. Raises HybridEPMismatchError on every rank when the stamps differ, before any
        data moves; the largest token count sizes the call (growth)."""
        self.group.op = stamp.op
        entries = self.rendezvous.gather(stamp.op, (stamp.pack(), num_tokens))
        stamps = {r: CallStamp.unpack(packed) for r, (packed, _) in enumerate(entries)}
        message = mismatch_message(self.topo.rank, stamps)
        if message is not None:
            raise HybridEPMismatchError(message + "\n  (no data moved; the buffer is still "
                                        "usable)")
        self._largest_tokens = max(tokens for _, tokens in entries)

    # -- collectives of a call -------------------------------------------------------------
    def preprocess(self, routing_map: torch.Tensor, tokens: int, blocking: bool = True,
                   expert_counts: bool = False, received: int | None = None):
        """All-gather the routing (padded to ``tokens`` rows) and derive this rank's layout
        (``expert_counts`` matters to the CUDA engine only), with rows past ``received`` (the
        receive cap; None: none) dropped as the CUDA engine drops them.

        Returns (layout, gathered routing, largest token count of any rank); when that count
        exceeds ``tokens`` the caller grows the buffer and calls again. A ``blocking`` call
        that routes some rank more rows than ``received`` raises NeedsGrowth instead of
        dropping them (every rank sees the same gathered routing, so every rank raises).
        """
        if self._largest_tokens is None:
            raise RuntimeError("internal: preprocess before the call's agreement")
        needed = self._largest_tokens
        if needed > tokens:
            return None, None, needed
        gathered = all_gather_rows(routing_map.cpu(), tokens, self.group)
        if blocking and received is not None:
            routed = layouts.largest_received(gathered, self.experts)
            if routed > received:
                raise NeedsGrowth(routed, RECEIVED)
        layout = layouts.dispatch_layout(gathered, self.topo, self.experts, received)
        return layout, gathered, needed

    def grow(self, config) -> None:
        """Nothing is preallocated here; the layouts follow the new maximum by themselves."""

    # -- the network counters' model (HybridEPBuffer.transport_stats) ------------------------
    def count_dispatch_sends(self, config, layout, tokens: int, hidden, probs,
                             scaling_factor) -> None:
        """Adds a dispatch's network puts and signals (reference/network.py) to ``self.sends``;
        inside one domain nothing crosses the network."""
        if self.topo.num_of_nodes == 1:
            return
        widths = network.RowWidths(
            row=hidden.shape[1] * hidden.element_size(),
            probs=4 * self.experts * self.topo.ranks_per_domain if probs is not None else 0,
            scales=4 * scaling_factor.shape[1] if scaling_factor is not None else 0)
        network.count_dispatch_sends(self.sends, layout.attn_to_rdma_map, tokens,
                                     config.num_of_tokens_per_chunk_dispatch_api,
                                     config.num_sms_dispatch_api, widths,
                                     per_token_probs=self.prob_puts == "token", eager=self.eager)

    def count_combine_sends(self, config, layout, tokens: int, hidden,
                            with_probs: bool) -> None:
        """The combine's network leg, modelled like the dispatch's: the partials travel at the
        wire's width (HYBRID_EP_COMBINE_WIRE), their probs fp32."""
        if self.topo.num_of_nodes == 1:
            return
        widths = network.RowWidths(
            row=(2 if self.combine_wire == "bf16" else 4) * hidden.shape[1],
            probs=4 * self.experts * self.topo.ranks_per_domain if with_probs else 0,
            scales=0)
        network.count_combine_sends(self.sends, layout.rdma_to_attn_map, self.topo.node_rank, tokens,
                                    config.num_of_tokens_per_chunk_dispatch_api,
                                    config.num_sms_combine_api, widths, eager=self.eager)

    # -- dispatch ----------------------------------------------------------------------------
    def move_rows(self, hidden: torch.Tensor, probs: torch.Tensor | None,
                  scaling_factor: torch.Tensor | None, layout: layouts.DispatchLayout,
                  tokens: int, keep_in_buffer: bool = False, fused_permute=None):
        """The rows this rank receives, as tensors (``keep_in_buffer`` and ``fused_permute``
        are the CUDA engine's: nothing is registered or fused here)."""
        rows = layout.num_dispatched_tokens
        move = self._mover(layout, tokens, rows)
        out_hidden = move(hidden)
        out_probs = None
        if probs is not None:
            width = self.experts * self.topo.ranks_per_domain
            node = self.topo.node_rank
            # The network leg carries only the destination domain's columns.
            out_probs = move(probs, columns=slice(node * width, (node + 1) * width))
        out_scales = move(scaling_factor) if scaling_factor is not None else None
        return out_hidden, out_probs, out_scales

    def _mover(self, layout, tokens, rows):
        def move(x: torch.Tensor, columns: slice | None = None) -> torch.Tensor:
            tiles = movement.forward_to_domain(x, layout.rdma_to_attn_map, tokens, self.topo,
                                               self.group)
            if columns is not None:
                tiles = tiles[:, columns].contiguous()
            return movement.scatter_in_domain(tiles, layout.sparse_to_dense_map.to(x.device),
                                              rows, self.topo, self.group)
        return move

    # -- combine -----------------------------------------------------------------------------
    @staticmethod
    def combine_input(rows: int, cols: int, device: torch.device) -> torch.Tensor:
        """A tensor for the next combine's input: nothing is registered here, so a plain one."""
        return torch.empty(rows, cols, dtype=torch.bfloat16, device=device)

    def combine_rows(self, hidden: torch.Tensor, probs: torch.Tensor | None,
                     layout: layouts.DispatchLayout, tokens: int, num_tokens: int):
        """``hidden`` [D, H] (any float dtype, summed in fp32), ``probs`` fp32 [D, E*R]."""
        s2d = layout.sparse_to_dense_map
        partial = movement.reduce_in_domain(hidden.float(), s2d, self.topo, self.group)
        if self.topo.num_of_nodes > 1 and self.combine_wire == "bf16":
            # Each domain's partial is rounded once to BF16 before it crosses the network, then
            # the source sums the domains' partials in fp32 (docs/semantics.md, combine).
            partial = partial.to(torch.bfloat16).float()
        combined = movement.return_to_source(partial, layout.rdma_to_attn_map, tokens,
                                             num_tokens, self.topo, self.group)
        combined_probs = None
        if probs is not None:
            partial_probs = movement.reduce_in_domain(probs.float(), s2d, self.topo, self.group,
                                                      column_block=self.experts)
            combined_probs = movement.return_to_source(
                partial_probs, layout.rdma_to_attn_map, tokens, num_tokens, self.topo,
                self.group, concat_domains=True)
        return combined.to(torch.bfloat16), combined_probs

    # -- permute / unpermute (local to the rank) ---------------------------------------------
    def chunk_layout(self, layout, routing, config) -> torch.Tensor:
        """The preprocess builds none here: computed from the gathered routing."""
        return layouts.dense_chunk_layout(routing, self.topo, config.num_local_experts,
                                          config.num_of_tokens_per_chunk_dispatch_api,
                                          config.received_rows)

    def permute_plan(self, layout: layouts.DispatchLayout, pad_multiple: int,
                     num_permuted_tokens: int | None) -> layouts.PermuteLayout:
        return layouts.permute_layout(layout.local_expert_routing_map.cpu(),
                                      layout.num_dispatched_tokens, pad_multiple,
                                      num_permuted_tokens)

    def permute(self, rows: torch.Tensor | None, probs: torch.Tensor | None,
                scaling_factor: torch.Tensor | None, plan: layouts.PermuteLayout):
        d2e = plan.dense_to_expert_map.to(torch.int64)
        dense_rows, experts = torch.nonzero(d2e >= 0, as_tuple=True)
        targets = d2e[dense_rows, experts]

        def place(src: torch.Tensor) -> torch.Tensor:
            out = torch.zeros(plan.num_permuted_tokens, *src.shape[1:], dtype=src.dtype,
                              device=src.device)
            if src.dtype.itemsize == 1 or src.dtype == torch.bfloat16:
                # Move raw bytes: index_put is not defined for every FP8 dtype.
                out.view(torch.uint8)[targets.to(src.device)] = (
                    src.view(torch.uint8)[dense_rows.to(src.device)])
            else:
                out[targets.to(src.device)] = src[dense_rows.to(src.device)]
            return out

        out_rows = place(rows) if rows is not None else None
        out_scales = place(scaling_factor) if scaling_factor is not None else None
        out_probs = None
        if probs is not None:
            column = (self.topo.local_rank * self.experts + experts).to(probs.device)
            out_probs = torch.zeros(plan.num_permuted_tokens, dtype=torch.float32,
                                    device=probs.device)
            out_probs[targets.to(probs.device)] = probs[dense_rows.to(probs.device), column]
        return out_rows, out_probs, out_scales

    def unpermute(self, hidden: torch.Tensor, probs: torch.Tensor | None,
                  dense_to_expert_map: torch.Tensor, num_dispatched: int):
        """[P, H] and [P] -> fp32 [D, H] (sum over local experts, ascending) and [D, E*R]."""
        d2e = dense_to_expert_map[:num_dispatched].to(torch.int64).to(hidden.device)
        dense = torch.zeros(num_dispatched, hidden.shape[1], dtype=torch.float32,
                            device=hidden.device)
        for expert in range(self.experts):
            rows = d2e[:, expert]
            valid = rows >= 0
            dense[valid] += hidden[rows[valid]].float()
        dense_probs = None
        if probs is not None:
            width = self.experts * self.topo.ranks_per_domain
            dense_probs = torch.zeros(num_dispatched, width, dtype=torch.float32,
                                      device=probs.device)
            for expert in range(self.experts):
                rows = d2e[:, expert]
                valid = rows >= 0
                column = self.topo.local_rank * self.experts + expert
                dense_probs[valid, column] = probs[rows[valid]].float()
        return dense, dense_probs

    def unpermute_combine(self, hidden: torch.Tensor, probs: torch.Tensor | None,
                          layout: layouts.DispatchLayout, dense_to_expert_map: torch.Tensor,
                          num_dispatched: int, tokens: int, num_tokens: int, fused: bool = False):
        """combine_with_unpermute: the fp32 unpermuted sums go into combine unrounded (one way
        to compute them: ``fused`` is the CUDA engine's)."""
        dense, dense_probs = self.unpermute(hidden, probs, dense_to_expert_map, num_dispatched)
        return self.combine_rows(dense, dense_probs, layout, tokens, num_tokens)
