"""The pure-torch reference engine: exact semantics (docs/semantics.md) over any process group."""

from .engine import ReferenceEngine
from .layout import dispatch_layout, permute_layout

__all__ = [
           "ReferenceEngine",
           "dispatch_layout",
           "permute_layout",
]
