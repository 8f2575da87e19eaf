"""What makes HybridEPBuffer's calls collective on the host: each buffer's rendezvous, and the
note a rank leaves there when it raises on its own input before a call's first exchange.

Every call (construction included) is made by every rank in the same order. A call starts
with an agreement (call_stamp.py); a rank that raises before it would leave its peers waiting
there, so on the host-side rendezvous (construction, and every call of the reference engine)
it leaves its message instead, and its peers raise at once (rendezvous.note_failure). The CUDA
engine's calls agree on the GPU, whose peers report a bounded timeout naming the rank instead.
"""

from __future__ import annotations

import collections
import functools

import torch

from .errors import HybridEPMismatchError
from .rendezvous import Rendezvous

CONSTRUCTION = "HybridEPBuffer()"

# Buffers built on each group by this process: with every rank building its buffers in the same
# order (construction is collective), the n-th buffer of a group has the same number everywhere
# and names its rendezvous keys with it.
_BUFFERS_OF_GROUP: collections.Counter = collections.Counter()


def buffer_rendezvous(group, timeout_s: float) -> Rendezvous:
    """The rendezvous of a new buffer on ``group``: every host exchange of the buffer
    (construction, the reference engine's calls, the CUDA engine's set-up and release) is
    bounded by HYBRID_EP_TIMEOUT_S."""
    key = str(getattr(group, "group_name", None) or id(group))
    _BUFFERS_OF_GROUP[key] += 1
    return Rendezvous(group, f"buffer{_BUFFERS_OF_GROUP[key]}", timeout_s)


def collective(op: str):
    """A public method of the buffer that is one collective call. It marks ``_call_agreed``
    once the call's agreement has run; raising ValueError or TypeError before that, the buffer
    leaves its peers the message (``_note_failure``)."""
    def wrap(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            self._call_agreed = False
            self._call_engine = None
            try:
                return method(self, *args, **kwargs)
            except (ValueError, TypeError) as error:
                if not self._call_agreed and not isinstance(error, HybridEPMismatchError):
                    self._note_failure(op, error, args, kwargs)
                raise
        return call
    return wrap


def on_reference_engine(env_engine: str, call_engine, reference, args, kwargs) -> bool:
    """Whether a call that raised ran (or would have run) on the reference engine: the engine it
    picked, else the one its first tensor (hidden, or a handle's) would pick."""
    if call_engine is not None:
        return call_engine is reference
    first = kwargs.get("hidden", kwargs.get("handle", args[0] if args else None))
    if isinstance(first, tuple) and first and isinstance(first[0], torch.Tensor):
        first = first[0]  # a handle
    if isinstance(first, torch.Tensor):
        return env_engine == "reference" or first.device.type == "cpu"
    return env_engine == "reference" or not torch.cuda.is_available()
