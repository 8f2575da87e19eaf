"""hybrid-ep-bench: the benchmark of hybrid-ep, installed apart from the product
(``pip install --no-build-isolation ./benchmarks`` from the checkout). ``hybrid-ep bench`` runs
:func:`hybrid_ep_bench.cli.main`: the reference engine over gloo on the CPU (:mod:`.cpu`), the
CUDA engine on GPUs (:mod:`.gpubench`), every result checked against :mod:`.oracle` first. The
bench's own kernels (the TMA copy ceiling, the start gate) are ``hybrid_ep_bench._C``."""
