"""The errors a call can raise because of other ranks (bad input of this rank raises ValueError or
TypeError naming the argument, see validation.py)."""

from __future__ import annotations


class HybridEPTimeoutError(RuntimeError):
    """A wait for a peer gave up after ``HYBRID_EP_TIMEOUT_S`` seconds: a peer died, hung, raised
    before reaching the call, or called a different operation. The buffer cannot be used any
    more (on the CPU, a buffer whose wait timed out before any data moved stays usable)."""


class HybridEPMismatchError(ValueError):
    """The ranks of a call disagree on its arguments (operation, dtypes, widths, which optional
    tensors, the handle) or one of them raised on its input: raised on every rank that sees it,
    before any data moves."""
