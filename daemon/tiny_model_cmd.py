"""`ascendra make-tiny-model DIR [--seed N] [--arch llama|qwen2|mistral] [--shape S]`."""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="output folder (created)")
    p.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    p.add_argument("--arch", choices=["llama", "qwen2", "mistral"], default="llama")
    p.add_argument("--shape", choices=["tiny", "llama3-8b"], default="tiny",
                   help="tiny (default), or a full-size shape with random weights for GPU "
                        "runs, drawn on --device")
    p.add_argument("--device", default="cpu", help="where a full-size shape's weights are "
                   "drawn (cuda: seconds; cpu: minutes)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from engines.models.tiny import make_tiny_model  # torch: only for this command
    path = make_tiny_model(args.dir, seed=args.seed, arch=args.arch, shape=args.shape,
                           device=args.device)
    print(f"wrote {args.shape} {args.arch} model (seed {args.seed}) to {path}")
    print(f"its tokenizer is in the same folder: give load testers --tokenizer {path}")
    return 0
