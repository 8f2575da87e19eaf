"""The GPU benchmark's host-side bookkeeping: profiler kernel events matched to operations."""

from __future__ import annotations

from hybrid_ep_bench.gpubench import rank_skew
from hybrid_ep_bench.gpubench.config import OPS, GpuBenchConfig, RankResult
from hybrid_ep_bench.gpubench.ranks import _assign_kernels
from hybrid_ep_bench.gpubench.timing import short_kernel_name

NAME = "void hybrid_ep::(anonymous namespace)::{}(hybrid_ep::Params)"


def _step_events(step: int, t0: float) -> list[tuple[float, float, str]]:
    """One benchmark step's kernels in stream order; durations encode (step, op)."""
    order = [("allgather_kernel", 0), ("scan_kernel", 0), ("dispatch_kernel", 1),  # pre
             ("dispatch_kernel", 2), ("dispatch_kernel", 3), ("combine_kernel", 4),
             ("combine_kernel", 11),  # combine of the tensor get_combine_input_buffer gave
             ("allgather_kernel", 0), ("scan_kernel", 0), ("dispatch_kernel", 5),
             ("permute_kernel", 6),
             ("allgather_kernel", 0), ("scan_kernel", 0), ("dispatch_kernel", 9),  # fused
             ("unpermute_kernel", 7), ("combine_kernel", 8),
             ("combine_kernel", 10)]  # fused unpermute + combine
    return [(t0 + i, 100.0 * step + code + (1.0 if code == 0 else 0.0), NAME.format(kernel))
            for i, (kernel, code) in enumerate(order)]


def test_permute_pair_kernels_are_summed_per_op():
    steps, iters = 4, 3
    events = [e for s in range(steps) for e in _step_events(s, 1000.0 * s)]
    events = events[3:]  # the profiler missed the start of the session
    result = RankResult(rank=0, device=0, gpu="x", sm_count=132)
    _assign_kernels(result, events, list(OPS), steps, iters, preprocess_per_step=3)
    for n, step in enumerate(range(steps - iters, steps)):
        base = 100.0 * step
        assert result.kernel_s["dispatch_pre"][n] == (base + 1) * 1e-6
        assert result.kernel_s["dispatch_bf16"][n] == (base + 2) * 1e-6
        assert result.kernel_s["dispatch_fp8"][n] == (base + 3) * 1e-6
        assert result.kernel_s["combine_bf16"][n] == (base + 4) * 1e-6
        assert result.kernel_s["combine_registered"][n] == (base + 11) * 1e-6
        assert abs(result.kernel_s["dispatch_permute"][n] - (2 * base + 11) * 1e-6) < 1e-12
        assert abs(result.kernel_s["combine_unpermute"][n] - (2 * base + 15) * 1e-6) < 1e-12
        assert result.kernel_s["dispatch_fused"][n] == (base + 9) * 1e-6
        assert result.kernel_s["combine_fused"][n] == (base + 10) * 1e-6
    assert result.profiler_note is None


def test_rank_skew_matches_launches_per_op_from_the_end():
    """Two ops launch dispatch_kernel each step; rank 1 starts 10 us late and both end
    together (the kernel waits for its peers); rank 0's profiler missed its first launch."""
    durations = {"first": 100.0, "second": 50.0}
    ranks = {}
    for rank in range(2):
        kernels = []
        for step in range(3):
            for n, (op, dur) in enumerate(durations.items()):
                start = 1000.0 * step + 200.0 * n + 10.0 * rank
                kernels.append({"start_us": start, "dur_us": dur - 10.0 * rank,
                                "name": NAME.format("dispatch_kernel")})
            kernels.append({"start_us": 1000.0 * step + 900.0, "dur_us": 5.0,
                            "name": "void at::native::copy_kernel(int)"})
        ranks[rank] = kernels[1:] if rank == 0 else kernels
    rows = rank_skew.skew_rows(ranks, {"dispatch_kernel": list(durations)})
    by_op = {row["kernel"]: row for row in rows}
    assert set(by_op) == {"dispatch_kernel (first)", "dispatch_kernel (second)"}
    for op, dur in durations.items():
        row = by_op[f"dispatch_kernel ({op})"]
        assert row["start_skew_us"] == 10.0 and row["end_skew_us"] == 0.0
        assert row["rank_time_us"] == dur - 5.0 and row["span_us"] == dur
        assert row["after_last_start_us"] == dur - 10.0
    assert by_op["dispatch_kernel (second)"]["launches"] == 3
    assert by_op["dispatch_kernel (first)"]["launches"] == 2


def test_mps_share_does_not_depend_on_the_permute_ops():
    from hybrid_ep_bench.gpubench.config import GpuBenchConfig, RunSpec
    from hybrid_ep_bench.gpubench.ranks import plan_sharing

    for ranks, sms, share in ((2, 8, 50), (8, 16, 13)):
        spec = RunSpec("sm", ranks, sms)
        with_permute = plan_sharing(GpuBenchConfig(), spec, gpus=1, sms=132)
        without = plan_sharing(GpuBenchConfig(permute=False), spec, gpus=1, sms=132)
        assert with_permute.sm_percentage == without.sm_percentage == share
        assert without.permute_blocks == 0
        assert with_permute.permute_blocks == max(0, 132 // ranks - sms - 1)
    explicit = plan_sharing(GpuBenchConfig(permute_blocks=0), RunSpec("sm", 2, 8), 1, 132)
    assert explicit.sm_percentage == 7 and explicit.permute_blocks == 0
    alone = plan_sharing(GpuBenchConfig(), RunSpec("sm", 1, 8), gpus=1, sms=132)
    assert alone.sm_percentage is None
    unpartitioned = plan_sharing(GpuBenchConfig(mps_partition=False), RunSpec("hbm", 8, 16), 1, 132)
    assert unpartitioned.sm_percentage is None


def test_default_regimes_run_4_and_8_ranks_x_16_sms_and_1_and_2_ranks_x_8():
    """Issue 40: 4 ranks x 16 SMs is a regime of its own beside 8 x 16; --ranks still picks one
    rank count for every regime asked for."""
    from hybrid_ep_bench.gpubench.ranks import specs

    runs = [(s.regime, s.ranks, s.sms) for s in specs(GpuBenchConfig())]
    assert runs == [("hbm", 4, 16), ("hbm", 8, 16), ("sm", 1, 8), ("sm", 2, 8)]
    one = GpuBenchConfig(regimes=("hbm",), hbm_ranks=(4,))
    assert [(s.regime, s.ranks) for s in specs(one)] == [("hbm", 4)]


def test_short_kernel_names_drop_namespaces_templates_and_parameters():
    assert short_kernel_name(NAME.format("dispatch_kernel")) == "dispatch_kernel"
    assert short_kernel_name(
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)"
    ) == "vectorized_elementwise_kernel"
    assert short_kernel_name("Memcpy DtoD (Device -> Device)") == "Memcpy DtoD"
