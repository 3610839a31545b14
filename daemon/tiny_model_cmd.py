"""`ascendra make-tiny-model DIR [--seed N] [--arch llama|qwen2|mistral]`."""
from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("make-tiny-model", help="write a small random-weight Llama-family checkpoint "
                       "in the Hugging Face folder format")
    p.add_argument("dir", help="output folder (created)")
    p.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    p.add_argument("--arch", choices=["llama", "qwen2", "mistral"], default="llama")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from engines.models.tiny import make_tiny_model  # torch: only for this command
    path = make_tiny_model(args.dir, seed=args.seed, arch=args.arch)
    print(f"wrote tiny {args.arch} model (seed {args.seed}) to {path}")
    print(f"its tokenizer is in the same folder: give load testers --tokenizer {path}")
    return 0
