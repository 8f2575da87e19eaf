"""The pure-torch reference engine: exact semantics (docs/semantics.md) over any process group."""

from .engine import ReferenceEngine
from .layout import DispatchLayout, PermuteLayout, dispatch_layout, permute_layout

__all__ = [
           "DispatchLayout",
           "PermuteLayout",
           "ReferenceEngine",
           "dispatch_layout",
           "permute_layout",
]
