"""The multi-domain matrix and the counter test run again with a backend's own device puts and
signals, its mapped-peer shortcut switched off by an environment variable (nixl:
HYBRID_EP_NIXL_DIRECT=0, nvshmem: HYBRID_EP_NVSHMEM_DIRECT=0). Shared by test_gpu_nixl.py and
test_gpu_nvshmem.py."""

from __future__ import annotations

from gpu_specs import domain_matrix_spec, report, run_under_env
from test_gpu_multi_domain import matrix_params

# (W, placement, R, case) of every multi-domain matrix case that fits eight ranks.
MATRIX_PARAMS = matrix_params(most_ranks=8)


def run_matrix_case(gpu_pools, record_property, W, placement, R, case, environment: dict,
                    label: str) -> None:
    spec = domain_matrix_spec(W, R, case)
    results = run_under_env(gpu_pools, W, placement, environment, "dispatch_combine", spec)
    report(record_property, results, label=f"{W // R}x{R} {label} tokens={spec['tokens']}")


def run_counters_case(gpu_pools, channels: int, environment: dict) -> None:
    W, R = 8, 2
    results = gpu_pools.run(W, "shared", "under_env", module="gpu_multi_domain_cases",
                            environment=environment, case="counters", R=R, pattern="runs",
                            dtype="fp8", with_probs=True, channels=channels, tokens=200)
    assert all(r["cuda_dispatch"]["puts"] > 0 for r in results), results
