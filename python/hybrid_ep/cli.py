"""Command line: ``hybrid-ep bench`` (also ``python -m hybrid_ep``) and ``hybrid-ep info``."""

from __future__ import annotations

import argparse
import json
import sys


def _bench(args) -> int:
    from . import bench

    cfg = bench.BenchConfig(ranks=args.ranks, nodes=args.nodes, hidden=args.hidden,
                            tokens=args.tokens, experts_per_rank=args.experts_per_rank,
                            topk=args.topk, iters=args.iters, warmup=args.warmup,
                            fp8=not args.no_fp8, device=args.device, seed=args.seed)
    for name in ("ranks", "nodes", "hidden", "tokens", "experts_per_rank", "topk", "iters"):
        if getattr(cfg, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    if cfg.topk > cfg.experts_per_rank * cfg.ranks:
        raise SystemExit(f"--topk {cfg.topk} exceeds the {cfg.experts_per_rank * cfg.ranks} "
                         "experts in total")
    if cfg.hidden % 128 != 0:
        raise SystemExit(f"--hidden {cfg.hidden} must be a multiple of 128 (FP8 scales)")
    try:
        device, rows = bench.run(cfg)
    except Exception as error:  # noqa: BLE001 - a worker's failure arrives wrapped; report it
        print(f"hybrid-ep bench FAILED: {error}", file=sys.stderr)
        return 1
    print(bench.format_table(cfg, device, rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(bench.as_dict(cfg, device, rows), f, indent=2)
    return 0


def _info(_args) -> int:
    from . import ENV_VARS, __version__, native

    print(f"hybrid-ep {__version__}")
    loaded = native.load()
    if isinstance(loaded, ImportError):
        print(f"compiled core: missing ({loaded})")
    else:
        for key, value in loaded.build_info().items():
            print(f"{key}: {value}")
        print(f"visible CUDA devices: {loaded.device_count()}")
    print("environment variables:")
    for var in ENV_VARS:
        print(f"  {var.name} (default {var.default}): {var.meaning}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hybrid-ep", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="run dispatch/combine over local ranks, verify and time them")
    b.add_argument("--ranks", type=int, default=4, help="local ranks to spawn (default 4)")
    b.add_argument("--nodes", type=int, default=1, help="NVLink domains the ranks split into")
    b.add_argument("--hidden", type=int, default=2048)
    b.add_argument("--tokens", type=int, default=512, help="tokens per rank")
    b.add_argument("--experts-per-rank", type=int, default=4)
    b.add_argument("--topk", type=int, default=4)
    b.add_argument("--iters", type=int, default=5, help="timed iterations")
    b.add_argument("--warmup", type=int, default=1)
    b.add_argument("--no-fp8", action="store_true", help="skip the FP8 dispatch")
    b.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: the CUDA engine on a GPU build, else the reference on the CPU")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--json", help="also write the results to this JSON file")
    b.set_defaults(func=_bench)
    i = sub.add_parser("info", help="build info and environment variables")
    i.set_defaults(func=_info)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
