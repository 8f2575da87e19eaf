"""The compiled core ``hybrid_ep._C``: loaded lazily so the pure-Python parts work without it."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
from pathlib import Path


@functools.cache
def load():
    """The extension module, or the ImportError that explains why it is missing."""
    try:
        return importlib.import_module("hybrid_ep._C")
    except ImportError as error:  # e.g. a source checkout that was never built
        return error


def module():
    try:
        return importlib.import_module("hybrid_ep._C")
    except ImportError as error:
        missing = missing_library_message(error)
        if missing is not None:
            raise ImportError(missing) from error
        raise ImportError(f"hybrid_ep._C is not available ({error}); install the package with "
                          "`pip install .` (or bash tools/setup.sh) to build it") from error


# build_info.cpp keeps "<prefix><library>" whole in the module's read-only data, so it can be
# read from the file when the module itself cannot be loaded.
_LIBRARY_MARKER = b"hybrid-ep transport library: "
_MISSING = re.compile(r"(lib[\w.+\-]+\.so[\w.]*): cannot open shared object file")
_NVSHMEM = re.compile(r"NVSHMEM (\d+)\.(\d+)\.(\d+) \((.*)\)")


def built_against(path: str) -> str | None:
    """The transport library the module file ``path`` was built against, e.g. "NVSHMEM 3.8.0
    (<lib dir>)"; None when it names none (p2p) or the file cannot be read."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    at = data.find(_LIBRARY_MARKER)
    if at < 0:
        return None
    end = data.find(b"\0", at)
    return data[at + len(_LIBRARY_MARKER):end].decode(errors="replace") or None


def missing_library_message(error: ImportError, path: str | None = None) -> str | None:
    """For an import of hybrid_ep._C (the file ``path``; default: where the package has it)
    that failed because a shared library it links is missing: what is missing, what the build
    was made against and how to provide it. None for any other import failure."""
    found = _MISSING.search(str(error))
    if found is None:
        return None
    if path is None:
        spec = importlib.util.find_spec("hybrid_ep._C")
        path = spec.origin if spec is not None else None
    library = built_against(path) if path else None
    message = (f"hybrid_ep._C ({path or 'not found'}) cannot load: {found[1]} is missing "
               f"({error}).")
    nvshmem = _NVSHMEM.match(library or "")
    if nvshmem is not None:
        major, minor, patch, folder = nvshmem.groups()
        message += (f" This is the nvshmem build, made against NVSHMEM {major}.{minor}.{patch} "
                    f"from {folder}. Install a matching NVSHMEM into this Python: `pip install "
                    f"\"nvidia-nvshmem-cu13>={major}.{minor},<{int(major) + 1}\"` (NVSHMEM needs the "
                    "same major version and a library at least as new as the build's), or put "
                    "the folder holding libnvshmem_host.so.3 on LD_LIBRARY_PATH.")
    elif library is not None:
        message += (f" The build was made against {library}; install it, or put the folder "
                    "holding the library on LD_LIBRARY_PATH.")
    return message


@functools.cache  # every CUDA call asks; the build does not change in a process
def cuda_engine_built() -> bool:
    """Whether the compiled core loads: every build of it holds the CUDA engine."""
    return not isinstance(load(), ImportError)

