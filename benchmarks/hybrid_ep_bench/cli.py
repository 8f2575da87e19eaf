"""``hybrid-ep bench``: dispatch and combine over local ranks, verified, timed, tabulated: the
reference engine over gloo on the CPU (:mod:`hybrid_ep_bench.cpu`), the CUDA engine on GPUs
(:mod:`hybrid_ep_bench.gpubench`). The product's ``hybrid-ep bench`` hands its arguments to
:func:`main`; ``python -m hybrid_ep_bench`` runs the same."""

from __future__ import annotations

import argparse
import json
import sys

from hybrid_ep.backends import p2p_wire
from hybrid_ep.cli import check_writable, count_at_least

from . import cpu

# Defaults of the CPU bench (the reference engine over gloo); --device cuda has its own
# (hybrid_ep_bench.gpubench.GpuBenchConfig).
_CPU_DEFAULTS = {"ranks": 4, "hidden": 2048, "tokens": 512, "experts_per_rank": 4, "topk": 4,
                 "iters": 5, "warmup": 1}


def _check_shape(topk: int, experts_total: int, hidden: int) -> None:
    if topk > experts_total:
        raise SystemExit(f"--topk {topk} exceeds the {experts_total} experts in total")
    if hidden % 128 != 0:
        raise SystemExit(f"--hidden {hidden} must be a multiple of 128 (FP8 scales)")


def _bench(args) -> int:
    check_writable(args.json)
    device = cpu.pick_device(args.device)
    if args.wire is not None and (device != "cuda" or args.nodes < 2):
        raise SystemExit("--wire: the emulated NIC sits between domains of the CUDA engine; "
                         "give --device cuda and --nodes N >= 2")
    if device == "cuda":
        return _bench_gpu(args)
    for name, value in _CPU_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    cfg = cpu.BenchConfig(ranks=args.ranks, nodes=args.nodes, hidden=args.hidden,
                          tokens=args.tokens, experts_per_rank=args.experts_per_rank,
                          topk=args.topk, iters=args.iters, warmup=args.warmup,
                          fp8=not args.no_fp8, device=args.device, seed=args.seed)
    for name in ("ranks", "nodes", "hidden", "tokens", "experts_per_rank", "topk", "iters"):
        if getattr(cfg, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    _check_shape(cfg.topk, cfg.experts_per_rank * cfg.ranks, cfg.hidden)
    try:
        device, rows = cpu.run(cfg)
    except Exception as error:  # noqa: BLE001 - a worker's failure arrives wrapped; report it
        print(f"hybrid-ep bench FAILED: {error}", file=sys.stderr)
        return 1
    print(cpu.format_table(cfg, device, rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(cpu.as_dict(cfg, device, rows), f, indent=2)
    return 0


def _bench_domains(args) -> int:
    """``--device cuda --nodes N`` (N >= 2): hybrid_ep_bench.gpubench.domains."""
    from .gpubench import domains

    base = domains.DomainBenchConfig()
    try:
        channels = tuple(int(c) for c in args.channels.split(","))
    except ValueError:
        raise SystemExit(f"--channels {args.channels!r}: expected counts like 1,2,4") from None
    given = {name: getattr(args, name) for name in ("hidden", "tokens", "experts_per_rank",
                                                     "topk", "iters", "warmup", "sms")
             if getattr(args, name) is not None}
    try:
        wire = p2p_wire.parse(args.wire, "--wire")
    except ValueError as error:
        raise SystemExit(str(error)) from None
    if args.wire is not None and wire is None:
        raise SystemExit(f"--wire {args.wire!r}: expected a spec such as {p2p_wire.DEFAULT_TEXT}")
    cfg = domains.DomainBenchConfig(
        ranks=args.ranks if args.ranks is not None else 2 * args.nodes, nodes=args.nodes,
        channels=channels, seed=args.seed, label=args.label or "", mps=not args.no_mps,
        out_dir=args.out_dir if args.out_dir is not None else base.out_dir,
        wire=wire.text() if wire is not None else None,
        prob_puts=("run", "token") if args.prob_puts == "both" else (args.prob_puts,),
        eager={None: (), "off": (False,), "on": (True,), "both": (False, True)}[args.eager],
        **given)
    if cfg.ranks % cfg.nodes != 0:
        raise SystemExit(f"--nodes {cfg.nodes} must divide --ranks {cfg.ranks}")
    if min(channels) < 1 or max(channels) > 64:
        raise SystemExit(f"--channels {args.channels}: each count must be in 1..64")
    _check_shape(cfg.topk, cfg.experts_per_rank * cfg.ranks, cfg.hidden)
    try:
        print(domains.run(cfg, json_path=args.json))
    except Exception as error:  # noqa: BLE001 - a worker's failure arrives wrapped; report it
        print(f"hybrid-ep bench FAILED: {error}", file=sys.stderr)
        return 1
    print(f"hybrid-ep bench: table written to {cfg.out_dir}/")
    return 0


def _bench_gpu(args) -> int:
    from . import gpubench

    if args.nodes < 1:
        raise SystemExit("--nodes must be >= 1")
    if args.nodes > 1:
        return _bench_domains(args)

    base = gpubench.GpuBenchConfig()
    regimes = ("hbm", "sm") if args.regime == "all" else (args.regime,)
    given = {name: getattr(args, name) for name in ("hidden", "tokens", "experts_per_rank",
                                                     "topk", "iters", "warmup")
             if getattr(args, name) is not None}
    cfg = gpubench.GpuBenchConfig(
        regimes=regimes,
        hbm_ranks=(args.ranks,) if args.ranks is not None else base.hbm_ranks,
        hbm_sms=args.sms if args.sms is not None else base.hbm_sms,
        sm_ranks=(args.ranks,) if args.ranks is not None else base.sm_ranks,
        sm_sms=args.sms if args.sms is not None else base.sm_sms,
        fp8=not args.no_fp8, permute=not args.no_permute, seed=args.seed,
        label=args.label or "",
        mps_partition=not args.no_mps_partition, permute_blocks=args.permute_blocks,
        mps=not args.no_mps,
        kernel_traces=args.kernel_traces,
        out_dir=args.out_dir if args.out_dir is not None else "hybrid-ep-bench", **given)
    for name in ("hidden", "tokens", "experts_per_rank", "topk", "iters"):
        if getattr(cfg, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    if cfg.warmup < 1:
        raise SystemExit("--warmup must be >= 1 with --device cuda (the first warm-up call is "
                         "the one verified)")
    ranks = list(cfg.hbm_ranks) if "hbm" in regimes else []
    ranks += list(cfg.sm_ranks) if "sm" in regimes else []
    if min(ranks) < 1 or min(cfg.hbm_sms, cfg.sm_sms) < 1:
        raise SystemExit("--ranks and --sms must be >= 1")
    _check_shape(cfg.topk, cfg.experts_per_rank * min(ranks), cfg.hidden)
    try:
        gpubench.run(cfg, json_path=args.json)
    except Exception as error:  # noqa: BLE001 - a worker's failure arrives wrapped; report it
        print(f"hybrid-ep bench FAILED: {error}", file=sys.stderr)
        return 1
    print(f"hybrid-ep bench: tables and raw numbers written to {cfg.out_dir}/")
    return 0


def parser(prog: str) -> argparse.ArgumentParser:
    b = argparse.ArgumentParser(
        prog=prog, description="run dispatch/combine over local ranks, verify and time them")
    b.add_argument("--ranks", type=count_at_least(1), default=None,
                   help="local ranks to spawn (cpu: default 4; cuda: overrides the regime's, "
                        "hbm 4 and 8, sm 1 and 2)")
    b.add_argument("--nodes", type=count_at_least(1), default=1,
                   help="NVLink domains the ranks split into (cuda: >= 2 runs the multi-domain "
                        "bench, default ranks 2 x nodes, 8 SMs each)")
    b.add_argument("--hidden", type=count_at_least(1), default=None,
                   help="cpu: default 2048; cuda: 7168")
    b.add_argument("--tokens", type=count_at_least(1), default=None,
                   help="tokens per rank (cpu: default 512; cuda: 4096)")
    b.add_argument("--experts-per-rank", type=count_at_least(1), default=None,
                   help="cpu: default 4; cuda: 8")
    b.add_argument("--topk", type=count_at_least(1), default=None, help="cpu: default 4; cuda: 8")
    b.add_argument("--iters", type=count_at_least(1), default=None,
                   help="timed iterations (cpu: default 5; cuda: 20)")
    b.add_argument("--warmup", type=count_at_least(0), default=None,
                   help="cpu: default 1; cuda: 3")
    b.add_argument("--no-fp8", action="store_true", help="skip the FP8 dispatch")
    b.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: the CUDA engine on a GPU build, else the reference on the CPU")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--json", help="also write the results to this JSON file")
    g = b.add_argument_group("cuda", "options of --device cuda (hybrid_ep_bench.gpubench)")
    g.add_argument("--regime", choices=("hbm", "sm", "all"), default="all",
                   help="hbm: 4 and 8 ranks on one GPU x 16 SMs vs the HBM roofline; sm: 1 and 2 "
                        "ranks x 8 SMs vs the per-SM TMA copy ceiling; all: both (default)")
    g.add_argument("--sms", type=count_at_least(1), default=None,
                   help="SMs per rank for dispatch and combine (default: hbm 16, sm 8)")
    g.add_argument("--out-dir", default=None,
                   help="folder for bench-<regime>[-<label>].md and bench[-<label>].json "
                        "(default hybrid-ep-bench)")
    g.add_argument("--label", default=None, help="tag for the tables and file names")
    g.add_argument("--no-permute", action="store_true",
                   help="skip the dispatch_with_permute / combine_with_unpermute pair")
    g.add_argument("--channels", default="1,2,4",
                   help="with --nodes > 1: transport channel counts to run, comma-separated "
                        "(HYBRID_EP_NUM_CHANNELS; default 1,2,4)")
    g.add_argument("--permute-blocks", type=count_at_least(0), default=None,
                   help="permute blocks per rank of the fused dispatch_with_permute (default: "
                        "an even split of the GPU's SMs among the ranks on it, less the dispatch "
                        "SMs; 0 skips the fused op)")
    g.add_argument("--wire", default=None, metavar="SPEC",
                   help="with --nodes N: also run under the p2p build's emulated NIC "
                        "(HYBRID_EP_P2P_WIRE), e.g. gbps=50,latency_us=3,op_ns=400,rails=1, and "
                        "report its bound and the efficiency")
    g.add_argument("--prob-puts", choices=("run", "token", "both"), default="both",
                   help="with --wire: the prob puts of the wired forms (HYBRID_EP_PROB_PUTS)")
    g.add_argument("--eager", choices=("off", "on", "both"), default=None,
                   help="with --nodes N: the forms signalled (HYBRID_EP_EAGER=0), in the eager "
                        "form (1) or each both ways (default: as the environment says)")
    g.add_argument("--no-mps", action="store_true",
                   help="ranks sharing a GPU run without MPS (default: a running MPS daemon, "
                        "else a private one started and stopped for the run; without MPS the "
                        "tables say the numbers are not valid)")
    g.add_argument("--no-mps-partition", action="store_true",
                   help="ranks sharing a GPU get no MPS share of SMs (default: their SMs "
                        "per rank and permute blocks, an even split of the GPU unless "
                        "--permute-blocks says otherwise)")
    g.add_argument("--kernel-traces", action="store_true",
                   help="each rank also writes the kernels its profiler saw to "
                        "OUT_DIR/kernels-<regime>-<ranks>r-rank<rank>.json (for "
                        "python -m hybrid_ep_bench.gpubench.rank_skew OUT_DIR)")
    return b


def main(argv=None, prog: str = "hybrid-ep bench") -> int:
    return _bench(parser(prog).parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
