"""What HybridEPBuffer accepts only to be a drop-in for DeepEP's class of the same name.

Each entry is an argument (or method) of the original that has nothing to act on here: the
buffer accepts it, checks its type where it always has, and ignores it. Everything else the
original takes does what it does there (docs/semantics.md). docs/usage.md points here.
"""

from __future__ import annotations

from . import validation as v

# name -> why it is accepted, and what happens to it
CONSTRUCTOR = {
    "load_cached_kernels": "the original compiles kernels at run time and can load earlier "
                           "builds; every kernel here is compiled ahead of time: ignored",
    "use_shared_buffer": "the original may give dispatch and combine separate buffers; here "
                         "they always share one registered buffer: ignored",
    "enable_custom_allgather": "the original's choice of routing all-gather; here it is always "
                               "the runtime's own kernel: ignored",
}
DISPATCH_WITH_PERMUTE = {
    "use_host_meta": "the original's choice of where its permute metadata lives; here the "
                     "blocking and non-blocking modes decide that: checked to be a bool, ignored",
}
UPDATE_TEMPLATE_CONFIG = {
    "num_of_stages_s2g_combine_api": "store stages of the original's combine; the combine "
                                     "kernel here stores its rows directly: checked to be an "
                                     "int >= 1, ignored",
}
METHODS = {
    "empty_jit_cache": "empties the original's cache of kernels compiled at run time; nothing "
                       "is compiled at run time here, so it does nothing",
}


def check_use_host_meta(value) -> None:
    if value is not None:
        v.check_flag("use_host_meta", value)


def check_template_kwarg(key: str, value) -> bool:
    """True when ``key`` is an accepted, ignored update_template_config argument (checked)."""
    if key not in UPDATE_TEMPLATE_CONFIG:
        return False
    v.require_int(key, value, minimum=1)
    return True
