"""HybridEPBuffer's operations as every engine runs them, from the buffer's request (requests.py).

``Engine`` writes each operation once over the steps an engine provides (agree, preprocess,
grow, move_rows, permute_received, combine_rows, unpermute_combine, combine_input, and the
reference engine's model of its network sends): the buffer validates and calls one method, the
engine runs the call to its outputs and handle, and only the engine talks to its runtime.
"""

from __future__ import annotations

import sys
import warnings

import torch

from . import handle as handles
from . import validation as v
from .engines import RECEIVED, TOKENS, NeedsGrowth
from .requests import CombineInputRequest, CombineRequest, DispatchRequest, Request


class Engine:
    """The base of both engines: one method per public operation of HybridEPBuffer."""

    name = ""
    # Whether fuse_permute_dispatch / fuse_unpermute_combine run fused here (the CUDA engine's
    # grids); an engine with one way to compute the outputs ignores them.
    fuses = False
    # int32 [1]: rows the receive cap dropped in this rank's last dispatch that built its
    # layout (HybridEPBuffer.dropped_rows); None before one.
    dropped_rows = None

    # -- the operations ------------------------------------------------------------------------
    def dispatch(self, req: DispatchRequest):
        (out, out_probs, out_scales), layout, tokens, _ = self._dispatch_rows(
            req, keep_in_buffer=False, fused_permute=None)
        v.check_dispatched_count(req.num_dispatched_tokens, layout.num_dispatched_tokens)
        if req.num_dispatched_tokens_tensor is not None:
            req.num_dispatched_tokens_tensor.fill_(layout.num_dispatched_tokens)
        handle = req.handle
        if handle is None:
            hidden = req.hidden
            call = req.config.replace(
                max_num_of_tokens_per_rank=tokens, with_permute=False,
                num_tokens=hidden.shape[0], num_dispatched_tokens=layout.num_dispatched_tokens,
                own_rows=layout.own_rows, non_blocking=False, handle_id=next(req.handle_ids))
            handle = handles.make_dispatch_handle(layout, tokens, call, hidden.device)
        return out, out_probs, out_scales, handle

    def dispatch_with_permute(self, req: DispatchRequest):
        pad, made = req.pad_multiple, req.made
        fused = (pad, req.num_permuted_tokens) if req.fuse and self.fuses else None
        moved, layout, tokens, routing = self._dispatch_rows(req, keep_in_buffer=True,
                                                             fused_permute=fused)
        if fused is not None:
            (out, out_probs, out_scales), plan = moved
        else:
            (out, out_probs, out_scales), plan = self.permute_received(
                moved, layout, pad, req.num_permuted_tokens)
        v.check_dispatched_count(req.num_dispatched_tokens, layout.num_dispatched_tokens)

        device = req.hidden.device
        if isinstance(plan.overflow, torch.Tensor):
            overflow = plan.overflow.to(device=device, dtype=torch.int32).reshape(1)
        else:
            overflow = torch.tensor([int(plan.overflow)], dtype=torch.int32, device=device)
        handle = req.handle
        if handle is not None and plan.num_permuted_tokens == made.num_permuted_tokens:
            handle[10].copy_(overflow)
        else:
            config = req.config
            chunk_layout = (handle[5] if handle is not None
                            else self.chunk_layout(layout, routing, config))
            this_call = {"num_permuted_tokens": plan.num_permuted_tokens,
                         "non_blocking": req.non_blocking}
            # One replace per call: each copies the whole config.
            call = made.replace(**this_call) if made else config.replace(
                max_num_of_tokens_per_rank=tokens, with_permute=True,
                num_tokens=req.hidden.shape[0], num_dispatched_tokens=layout.num_dispatched_tokens,
                pad_multiple=pad, fuse_permute_dispatch=req.fuse,
                handle_id=next(req.handle_ids), **this_call)
            handle = handles.make_permute_handle(
                layout, chunk_layout, plan.dense_to_expert_map, plan.raw_tokens_per_expert,
                tokens, call, overflow, device)
        tokens_per_expert = plan.padded_tokens_per_expert.to(torch.int64)
        if req.non_blocking:
            tokens_per_expert = tokens_per_expert.to(device)
        elif device.type == "cuda":
            tokens_per_expert = tokens_per_expert.cpu().pin_memory()
        return out, out_probs, out_scales, tokens_per_expert, handle

    def combine(self, req: CombineRequest):
        self._agree(req, req.hidden.shape[0])
        handle = req.handle
        layout = handles.layout_from_handle(handle)
        self.count_combine_sends(req.config, layout, handle[5], req.hidden, req.probs is not None)
        return self.combine_rows(req.hidden, req.probs, layout, handle[5], req.made.num_tokens)

    def combine_with_unpermute(self, req: CombineRequest):
        self._agree(req, req.hidden.shape[0])
        handle, made = req.handle, req.made
        layout = handles.layout_from_handle(handle)
        self.count_combine_sends(req.config, layout, handle[8], req.hidden, req.probs is not None)
        return self.unpermute_combine(req.hidden, req.probs, layout, handle[6],
                                      made.num_dispatched_tokens, handle[8], made.num_tokens,
                                      fused=req.fuse and self.fuses)

    def get_combine_input_buffer(self, req: CombineInputRequest) -> torch.Tensor:
        self._agree(req, 0)
        return self.combine_input(req.rows, req.cols, req.device)

    # -- shared steps --------------------------------------------------------------------------
    def _agree(self, req: Request, rows: int) -> None:
        """The call's agreement (call_stamp.py), after every check of this rank's input."""
        self.agree(req.stamp, rows)
        req.agreed = True

    def _dispatch_rows(self, req: DispatchRequest, *, keep_in_buffer: bool, fused_permute):
        """Agree, build the layout (or take the handle's), then move the rows. Returns the rows,
        the layout, the call's token maximum and the gathered routing (None with a handle).
        With ``keep_in_buffer`` an engine may leave the rows where its permute step reads them;
        with ``fused_permute`` they come back permuted, with their layout."""
        hidden, probs, scales = req.hidden, req.probs, req.scaling_factor
        self._agree(req, hidden.shape[0])
        if req.handle is not None:
            layout = handles.layout_from_handle(req.handle)
            tokens = req.handle[8 if req.made.with_permute else 5]
            rows = self.move_rows(hidden, probs, scales, layout, tokens,
                                  keep_in_buffer=keep_in_buffer, fused_permute=fused_permute)
            self.count_dispatch_sends(req.config, layout, tokens, hidden, probs, scales)
            return rows, layout, tokens, None
        routing_map = req.routing_map.contiguous()
        while True:
            try:
                layout, routing, tokens = self._layout(req, routing_map, keep_in_buffer)
                rows = self.move_rows(hidden, probs, scales, layout, tokens,
                                      keep_in_buffer=keep_in_buffer, fused_permute=fused_permute)
            except NeedsGrowth as growth:  # found after the launches (CUDA) or the layout
                self._grow(req, growth.needed, growth.field)
                continue
            self.dropped_rows = layout.dropped_rows
            self.count_dispatch_sends(req.config, layout, tokens, hidden, probs, scales)
            return rows, layout, tokens, routing

    def _layout(self, req: DispatchRequest, routing_map: torch.Tensor, expert_counts: bool):
        """Gather the routing and build the layout; blocking calls agree on the token maximum
        with the other ranks and grow the buffer collectively when a rank has more tokens."""
        while True:
            tokens = req.config.max_num_of_tokens_per_rank
            layout, routing, needed = self.preprocess(routing_map, tokens,
                                                      blocking=not req.non_blocking,
                                                      expert_counts=expert_counts,
                                                      received=req.config.received_rows)
            if needed <= tokens:
                return layout, routing, tokens
            # Every rank saw the same gathered counts, so every rank grows here together.
            self._grow(req, needed)

    def _grow(self, req: DispatchRequest, needed: int, field: str = TOKENS) -> None:
        """Raises the config's ``field`` (a NeedsGrowth field) to ``needed``, collectively."""
        config = req.config
        now = config.received_rows if field == RECEIVED else config.max_num_of_tokens_per_rank
        advice = ("size the buffer for the largest batch" if field == TOKENS else
                  "pass a larger max_num_of_tokens_for_experts")
        warnings.warn(f"HybridEPBuffer: growing {field} from {now} to {needed} (collective, "
                      f"slow); {advice} to avoid this", RuntimeWarning,
                      stacklevel=_caller_level())
        req.config = config.replace(**{field: needed})
        self.grow(req.config)

    def permute_received(self, moved, layout, pad_multiple: int, num_permuted_tokens):
        """The received rows (``move_rows`` with ``keep_in_buffer``) in expert-major order, and
        their permuted layout."""
        plan = self.permute_plan(layout, pad_multiple, num_permuted_tokens)
        return self.permute(*moved, plan), plan

    def chunk_layout(self, layout, routing, config) -> torch.Tensor:
        """The dense chunk layout of a new permute handle: the one the preprocess built."""
        return layout.dense_chunk_layout

    def count_dispatch_sends(self, config, layout, tokens, hidden, probs, scaling_factor):
        """The network puts and signals a dispatch makes, where an engine models them (the CUDA
        engine's counters are read from the device instead)."""

    def count_combine_sends(self, config, layout, tokens, hidden, with_probs: bool):
        """Like count_dispatch_sends, for the combine's network leg."""


def _caller_level() -> int:
    """The stacklevel, for a warning issued by this module's caller, of the first frame outside
    the package: the code that called the buffer's method."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("hybrid_ep."):
        frame, level = frame.f_back, level + 1
    return level
