"""Command line (also ``python -m hybrid_ep``): ``hybrid-ep bench`` (a thin door to the
separately installed benchmark package, hybrid_ep_bench), ``hybrid-ep info``,
``hybrid-ep deep-ep-shim`` and ``hybrid-ep memory``."""

from __future__ import annotations

import argparse
import json
import os
import sys


def count_at_least(minimum: int):
    """An argparse type: an int >= ``minimum`` (argparse reports anything else, no traceback)."""
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value
    return parse


def check_writable(path: str | None) -> None:
    """Fails before the run, not after it, when ``--json`` cannot be written."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise SystemExit(f"--json {path}: is a folder; expected a file path")
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            raise SystemExit(f"--json {path}: not writable")
    elif not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise SystemExit(f"--json {path}: folder {folder} does not exist or is not writable")


# The benchmark is a package of its own (benchmarks/pyproject.toml): the product holds nothing
# that only measures.
BENCH_MISSING = ("hybrid-ep bench: the benchmark package hybrid-ep-bench is not installed. "
                 "Install it from the hybrid-ep checkout with `pip install --no-build-isolation "
                 "./benchmarks` (bash tools/setup.sh installs it too).")


def _bench(argv: list[str]) -> int:
    try:
        from hybrid_ep_bench.cli import main as bench_main
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] != "hybrid_ep_bench":
            raise  # installed, but something it imports is missing: that error says what
        raise SystemExit(BENCH_MISSING) from None
    return bench_main(argv, prog="hybrid-ep bench")


def _info(_args) -> int:
    from . import __version__, native
    from .config import effective_env

    print(f"hybrid-ep {__version__}")
    loaded = native.load()
    if isinstance(loaded, ImportError):
        print(f"compiled core: missing ({loaded})")
    else:
        for key, value in loaded.build_info().items():
            print(f"{key}: {value}")
        print(f"visible CUDA devices: {loaded.device_count()}")
    print("environment variables (value in effect; set: from the environment):")
    malformed = 0
    for var, value, error in effective_env():
        if error is not None:
            malformed += 1
            print(f"  {var.name} = {value!r}  MALFORMED: {error}")
        else:
            source = "set" if var.name in os.environ else "default"
            print(f"  {var.name} = {value} ({source}): {var.meaning}")
    if malformed:
        print(f"{malformed} malformed variable(s): a HybridEPBuffer would refuse to start")
        return 1
    return 0


def _deep_ep_shim(args) -> int:
    from .deep_ep_alias import write_deep_ep_shim

    try:
        package = write_deep_ep_shim(args.directory)
    except (FileExistsError, OSError) as error:
        print(f"hybrid-ep deep-ep-shim: {error}", file=sys.stderr)
        return 1
    print(f"wrote {package}; with {args.directory} first on PYTHONPATH, `from deep_ep import "
          "HybridEPBuffer` gives hybrid_ep's (delete the folder to undo)")
    return 0


def _memory(args) -> int:
    from .memory_plan import format_table, memory_plan

    check_writable(args.json)
    try:
        plan = memory_plan(args.world, args.ranks_per_domain, args.hidden, args.tokens,
                           args.experts_per_rank, combine_wire=args.combine_wire,
                           max_num_of_tokens_for_experts=args.max_tokens_for_experts,
                           net_ring_chunks=args.net_ring_chunks,
                           eager={None: None, "0": False, "1": True}[args.eager])
    except (TypeError, ValueError) as error:
        raise SystemExit(f"hybrid-ep memory: {error}") from None
    print(format_table(plan))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(plan, f, indent=2)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:
        return _bench(argv[1:])
    parser = argparse.ArgumentParser(prog="hybrid-ep", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    # Listed for --help only: main() hands everything after "bench" to the bench package,
    # which parses its own options.
    sub.add_parser("bench", add_help=False,
                   help="run dispatch/combine over local ranks, verify and time them (the "
                        "hybrid-ep-bench package; hybrid-ep bench --help lists its options)")
    i = sub.add_parser("info", help="build info and the environment variables in effect")
    i.set_defaults(func=_info)
    s = sub.add_parser("deep-ep-shim",
                       help="write DIRECTORY/deep_ep, an opt-in alias of hybrid_ep for clients "
                            "that import deep_ep (put DIRECTORY on PYTHONPATH)")
    s.add_argument("directory")
    s.set_defaults(func=_deep_ep_shim)
    m = sub.add_parser("memory", help="bytes of each region of the registered buffer a config "
                                      "needs per rank (hybrid_ep.memory_plan), no GPU needed")
    m.add_argument("--world", type=count_at_least(1), required=True, help="ranks in the group")
    m.add_argument("--ranks-per-domain", type=count_at_least(1), required=True,
                   help="ranks per NVLink domain (divides --world)")
    m.add_argument("--hidden", type=count_at_least(1), required=True, help="hidden_dim")
    m.add_argument("--tokens", type=count_at_least(1), required=True,
                   help="max_num_of_tokens_per_rank")
    m.add_argument("--experts-per-rank", type=count_at_least(1), required=True,
                   help="num_local_experts")
    m.add_argument("--max-tokens-for-experts", type=count_at_least(1), default=None,
                   help="max_num_of_tokens_for_experts: rows of the receive regions (default: "
                        "min(--world, 64) x --tokens)")
    m.add_argument("--combine-wire", choices=("bf16", "fp32"), default=None,
                   help="partial sums between domains (default: HYBRID_EP_COMBINE_WIRE, else bf16)")
    m.add_argument("--net-ring-chunks", type=count_at_least(1), default=None,
                   help="chunk slots per other domain of the rings between domains (default: "
                        "HYBRID_EP_NET_RING_CHUNKS, else every chunk while the ring stays within "
                        "256 MiB, else the deepest ring within 64 MiB)")
    m.add_argument("--eager", choices=("0", "1"), default=None,
                   help="1: the rows between domains in the eager form's tiles (default: "
                        "HYBRID_EP_EAGER where the build has the form, else 0)")
    m.add_argument("--json", help="also write the plan (region -> bytes) to this JSON file")
    m.set_defaults(func=_memory)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
