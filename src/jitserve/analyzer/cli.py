"""``jitserve analyzer serve`` and ``jitserve analyzer eval``.

Who owns what: this module parses arguments and turns bad values into
:class:`jitserve.errors.CLIError`; :mod:`.service` and :mod:`.evaluate` do the work.
"""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path
from typing import Any


def _error(message: str) -> Exception:
    from jitserve.errors import CLIError  # lazily: jitserve.cli imports this module

    return CLIError(message)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("analyzer", help="Request analyzer: QRF length bounds and "
                                   "pattern-graph stage shares over gRPC.")
    commands = parser.add_subparsers(dest="analyzer_command", metavar="ACTION", required=True)

    serve = commands.add_parser("serve", help="Run the analyzer gRPC service.")
    serve.add_argument("--host", default="0.0.0.0", help="Address to bind (default 0.0.0.0).")
    serve.add_argument("--port", type=int, default=50051, help="gRPC port (default 50051; 0: any).")
    serve.add_argument("--metrics-port", type=int, default=9464,
                       help="Prometheus /metrics port (default 9464; -1: off).")
    serve.add_argument("--state-dir", type=Path, default=None,
                       help="Checkpoint directory (model, observation buffer, history); "
                            "restored on start. Default: no persistence.")
    serve.add_argument("--quantile", type=float, default=0.95,
                       help="Default quantile of the length bound (default 0.95).")
    serve.add_argument("--corpus-size", type=int, default=12_000,
                       help="Synthetic prompts to train on when no model is checkpointed.")
    serve.add_argument("--seed", type=int, default=0, help="Seed of the synthetic corpus.")
    serve.add_argument("--retrain-min-new", type=int, default=500,
                       help="Observed completions that trigger a background retrain.")
    serve.add_argument("--retrain-interval", type=float, default=60.0,
                       help="Minimum seconds between retrains (default 60).")
    serve.add_argument("--checkpoint-interval", type=float, default=30.0,
                       help="Seconds between checkpoints when something changed (default 30).")
    serve.add_argument("--history-capacity", type=int, default=2000,
                       help="Pattern graphs kept (default 2000).")
    serve.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR.")
    serve.set_defaults(handler=_serve)

    ev = commands.add_parser("eval", help="Measure coverage, refinement, latency and matching; "
                             "writes DIR/analyzer.json and DIR/analyzer.png.")
    ev.add_argument("--out", type=Path, required=True, help="Output directory.")
    ev.add_argument("--quantile", type=float, default=0.95)
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--train-size", type=int, default=12_000)
    ev.add_argument("--test-size", type=int, default=4000)
    ev.add_argument("--batch1-calls", type=int, default=1000)
    ev.add_argument("--batch64-calls", type=int, default=200)
    ev.add_argument("--history-size", type=int, default=500)
    ev.set_defaults(handler=_eval)


def _check_quantile(q: float) -> None:
    if not (math.isfinite(q) and 0 < q < 1):
        raise _error(f"--quantile must be in (0, 1), got {q}")


def _serve(args: argparse.Namespace) -> int:
    from jitserve.analyzer.service import serve
    from jitserve.analyzer.service_config import ServiceConfig

    _check_quantile(args.quantile)
    if not 0 <= args.port <= 65535:
        raise _error(f"--port must be in [0, 65535], got {args.port}")
    level = getattr(logging, str(args.log_level).upper(), None)
    if not isinstance(level, int):
        raise _error(f"--log-level: unknown level {args.log_level!r}")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = ServiceConfig(
            quantile=args.quantile, state_dir=args.state_dir, seed=args.seed,
            corpus_size=args.corpus_size, retrain_min_new=args.retrain_min_new,
            retrain_interval_s=args.retrain_interval,
            checkpoint_interval_s=args.checkpoint_interval,
            history_capacity=args.history_capacity,
        )
    except ValueError as err:
        raise _error(str(err)) from err
    metrics_port = None if args.metrics_port < 0 else args.metrics_port
    try:
        return serve(config, args.host, args.port, metrics_port)
    except OSError as err:
        raise _error(f"cannot serve on {args.host}:{args.port}: {err}") from err


def _eval(args: argparse.Namespace) -> int:
    from jitserve.analyzer.evaluate import evaluate, summary

    _check_quantile(args.quantile)
    for name in ("train_size", "test_size", "batch1_calls", "batch64_calls", "history_size"):
        if getattr(args, name) < 1:
            raise _error(f"--{name.replace('_', '-')} must be >= 1")
    result = evaluate(args.out, quantile=args.quantile, seed=args.seed,
                      train_size=args.train_size, test_size=args.test_size,
                      batch1_calls=args.batch1_calls, batch64_calls=args.batch64_calls,
                      history_size=args.history_size)
    print(summary(result))
    print(f"wrote {args.out / 'analyzer.json'}")
    return 0
