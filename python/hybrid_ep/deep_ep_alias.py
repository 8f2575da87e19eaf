"""An opt-in module named ``deep_ep`` whose ``HybridEPBuffer`` is ours, for clients written for the
original (Megatron-Core's flex dispatcher imports ``from deep_ep import HybridEPBuffer``).

Nothing named ``deep_ep`` is ever installed by default. Two ways to opt in:

- in the process, before the client imports it: ``hybrid_ep.install_as_deep_ep()``;
- for a client that must run unmodified: ``hybrid-ep deep-ep-shim DIR`` writes ``DIR/deep_ep``,
  a package of three lines that imports ours; put DIR first on ``PYTHONPATH``.

Only ``HybridEPBuffer`` is provided: the original's other classes (``Buffer``, ``Config``) are
not, so ``from deep_ep import Buffer`` raises ImportError, which Megatron-Core takes as "DeepEP's
other backend is not installed".
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

MARKER = "__hybrid_ep_alias__"

_SHIM = '''"""deep_ep as an alias of hybrid_ep (written by `hybrid-ep deep-ep-shim`; delete to undo)."""
from hybrid_ep import HybridEPBuffer  # noqa: F401
__hybrid_ep_alias__ = True
'''


def _installed_elsewhere() -> bool:
    """Whether a real ``deep_ep`` is importable (or imported)."""
    module = sys.modules.get("deep_ep")
    if module is not None:
        return not getattr(module, MARKER, False)
    try:
        return importlib.util.find_spec("deep_ep") is not None
    except (ImportError, ValueError):
        return False


def install_as_deep_ep(replace: bool = False) -> types.ModuleType:
    """Registers a module ``deep_ep`` in this process whose ``HybridEPBuffer`` is
    ``hybrid_ep.HybridEPBuffer``; returns it. Refuses (RuntimeError) to shadow a real ``deep_ep``
    that is installed or imported unless ``replace=True``."""
    from .buffer import HybridEPBuffer

    if not isinstance(replace, bool):
        raise TypeError(f"replace: expected a bool, got {replace!r}")
    if _installed_elsewhere() and not replace:
        raise RuntimeError("install_as_deep_ep: a deep_ep package is installed or imported "
                           "already; pass replace=True to shadow it in this process")
    module = types.ModuleType("deep_ep", "hybrid_ep's HybridEPBuffer under the name deep_ep "
                                         "(hybrid_ep.install_as_deep_ep)")
    module.HybridEPBuffer = HybridEPBuffer
    module.__all__ = ["HybridEPBuffer"]
    setattr(module, MARKER, True)
    sys.modules["deep_ep"] = module
    return module


def write_deep_ep_shim(directory: str | Path) -> Path:
    """Writes ``directory/deep_ep/__init__.py`` (an alias of hybrid_ep); returns the package's
    folder. Refuses to overwrite a ``deep_ep`` there that it did not write."""
    package = Path(directory) / "deep_ep"
    init = package / "__init__.py"
    if init.exists() and MARKER not in init.read_text(errors="replace"):
        raise FileExistsError(f"{init}: a deep_ep package that hybrid-ep did not write is there")
    package.mkdir(parents=True, exist_ok=True)
    init.write_text(_SHIM)
    return package
