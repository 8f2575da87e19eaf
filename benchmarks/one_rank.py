"""What the one-rank benchmark scripts share: the problem's arguments, the commit label, and a
buffer with uniform top-k routing on GPU 0 (SM-bound configuration of the intra-domain
benchmark)."""

from __future__ import annotations

import argparse
import os
import subprocess
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hybrid_ep import HybridEPBuffer


def add_problem_args(ap: argparse.ArgumentParser, iters: int) -> None:
    ap.add_argument("--out", required=True)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--sms", type=int, default=8)
    ap.add_argument("--iters", type=int, default=iters)


def commit() -> str:
    if os.environ.get("HYBRID_EP_COMMIT"):
        return os.environ["HYBRID_EP_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_report(path: str, lines: list[str], shown: list[str] | None = None) -> None:
    """Writes the markdown report to ``path`` and prints ``shown`` (default: all of it)."""
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines if shown is None else shown))


@dataclass
class OneRank:
    buffer: HybridEPBuffer
    hidden: torch.Tensor  # BF16 [tokens, hidden]
    routing_map: torch.Tensor  # bool [tokens, experts], top-k of uniform scores
    probs: torch.Tensor  # fp32 [tokens, experts], nonzero on the chosen experts

    def close(self) -> None:
        self.buffer.destroy()
        dist.destroy_process_group()


def start(args, port: int) -> OneRank:
    """A one-rank gloo group on GPU 0 and its buffer (args.sms SMs per kernel family)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.cuda.set_device(0)
    T, E = args.tokens, args.experts
    buf = HybridEPBuffer(None, args.hidden, T, E, num_sms_dispatch_api=args.sms,
                         num_sms_combine_api=args.sms, num_sms_preprocessing_api=args.sms)
    hidden = torch.randn(T, args.hidden, device="cuda").bfloat16()
    scores = torch.rand(T, E, device="cuda")
    routing_map = torch.zeros(T, E, dtype=torch.bool, device="cuda")
    routing_map.scatter_(1, scores.topk(args.topk, dim=1).indices, True)
    probs = torch.rand(T, E, device="cuda") * routing_map
    return OneRank(buf, hidden, routing_map, probs)
