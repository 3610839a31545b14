"""Entry point of a tensor-parallel instance's rank 1..K-1 (engines/tp_ranks.py starts it):
`python -m engines.tp_rank_main --executor-json JSON --model-dir DIR --rank R --init URL
--commands ENDPOINT --parent-pid PID`. SIGTERM and SIGINT end it with exit code 0."""
from __future__ import annotations

import argparse
import logging
import signal
import sys

import msgspec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engines.tp_rank_main")
    parser.add_argument("--executor-json", required=True, help="the instance's ExecutorConfig")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--init", required=True, help="torch.distributed init method")
    parser.add_argument("--commands", required=True, help="rank 0's ZeroMQ endpoint")
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    from engines.executors.executor_config import ExecutorConfig
    config = msgspec.json.decode(args.executor_json, type=ExecutorConfig)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s tp-rank-{args.rank} %(levelname)s %(name)s: "
                               f"%(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    from engines.tp_ranks import serve_rank
    return serve_rank(config, args.model_dir, args.rank, args.init, args.commands,
                      args.parent_pid)


if __name__ == "__main__":
    sys.exit(main())
