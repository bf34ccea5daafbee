"""The ``seqapps`` command line.

Exit codes: 0 ok; 2 bad usage or bad input (one line naming what and where);
1 other failures. With ``--json`` the last line of stdout is one JSON object.
TensorFlow is imported only by the commands that need it.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any, Sequence

from seqapps import __version__
from seqapps.errors import SeqappsError, TrainingError

BENCHMARKS = {"bnce": "seqapps.bench.bnce", "hrnn": "seqapps.bench.hrnn", "serve": "seqapps.bench.serve"}


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config field (repeatable)")
    parser.add_argument("--strategy", default="auto", choices=["auto", "mirrored", "multiworker"],
                        help="tf.distribute strategy (multiworker reads TF_CONFIG)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """Returns the argument parser for all subcommands; ``argv`` selects which benchmark's options to load."""
    parser = argparse.ArgumentParser(prog="seqapps", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"seqapps {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    listing = commands.add_parser("list", help="list the pipelines")
    listing.add_argument("--json", action="store_true")

    run = commands.add_parser("run", help="train, evaluate and export a pipeline")
    run.add_argument("name", metavar="NAME", help="pipeline name (see `seqapps list`)")
    run.add_argument("--preset", default="default", help="tiny, default, full, or one of the pipeline's own")
    run.add_argument("--data", default=None, help="your data (default: the embedded data set)")
    run.add_argument("--config", default=None, help="YAML file of config fields")
    run.add_argument("--out", default="saved_models", help="export root (default: saved_models)")
    _add_run_options(run)

    finetune = commands.add_parser("finetune", help="continue training an export on your data")
    finetune.add_argument("name", metavar="NAME")
    finetune.add_argument("--from", dest="from_path", required=True, metavar="saved_models/NAME/VERSION")
    finetune.add_argument("--data", required=True)
    _add_run_options(finetune)

    predict = commands.add_parser("predict", help="run an export's serving signature on raw input")
    predict.add_argument("model", metavar="MODEL_DIR", help="saved_models/NAME[/VERSION]")
    predict.add_argument("inputs", nargs="+", metavar="INPUT")
    predict.add_argument("--json", action="store_true")

    serve = commands.add_parser("serve", help="serve saved_models/NAME/VERSION over TF Serving's REST API")
    serve.add_argument("model_root", nargs="?", default="saved_models", metavar="saved_models",
                       help="model root holding NAME/VERSION/ folders (default: saved_models)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    serve.add_argument("--port", type=int, default=8501, help="TCP port (0: a free one; default: 8501)")
    serve.add_argument("--max-batch-size", type=int, default=16,
                       help="merge concurrent requests into batches of up to N rows (default: 16; 0: off)")
    serve.add_argument("--batch-timeout-ms", type=float, default=0.0,
                       help="how long a batch waits for more requests (default: 0: it takes what queued "
                            "while the model was busy)")
    serve.add_argument("--max-body-bytes", type=int, default=32 * 1024 * 1024,
                       help="refuse larger request bodies with 400 (default: 32 MiB)")

    bench = commands.add_parser("bench", help="speed and memory benchmarks")
    benches = bench.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, module in BENCHMARKS.items():
        sub = benches.add_parser(name, help=f"benchmark {name}")
        sub.add_argument("--json", action="store_true")
        sub.set_defaults(bench_module=module)
        if list(argv[:2]) == ["bench", name]:  # import a benchmark only when it runs
            importlib.import_module(module).add_arguments(sub)
    return parser


def _print_result(result: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, default=str))
    elif isinstance(result, str):
        print(result)
    else:
        print(json.dumps(result, indent=2, default=str))


def _summary(result: dict[str, Any]) -> str:
    """A terminal summary of a run: metrics beside the baselines, then the export path."""
    rows = {"model": result["metrics"], **result.get("baseline", {})}
    if "metrics_before" in result:
        rows = {"before finetune": result["metrics_before"], **rows}
    keys = [k for k in result["metrics"] if "/" not in k]
    width = max(len(name) for name in rows)
    lines = [f"{result['pipeline']} ({result['preset']} preset) in {result['seconds']} s",
             " " * width + "".join(f"{k:>12}" for k in keys)]
    lines += [f"{name:<{width}}" + "".join(f"{values.get(k, float('nan')):>12.4g}" for k in keys)
              for name, values in rows.items()]
    lines.append(f"export: {result['export']}")
    return "\n".join(lines)


def _list(as_json: bool) -> None:
    from seqapps.pipeline import REGISTRY

    pipelines = [{"name": name, "summary": REGISTRY.summary(name)} for name in REGISTRY.names()]
    if as_json:
        print(json.dumps({"pipelines": pipelines}))
    else:
        width = max(len(p["name"]) for p in pipelines)
        for p in pipelines:
            print(f"{p['name']:<{width}}  {p['summary']}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``seqapps`` command; returns the exit code."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    interactive = sys.stdout.isatty() and not getattr(args, "json", False)
    try:
        if args.command == "list":
            _list(args.json)
        elif args.command == "run":
            from seqapps import runner

            result = runner.run(args.name, args.preset, args.data, args.config, args.overrides, args.out,
                                args.strategy, verbose=interactive)
            _print_result(result if args.json else _summary(result), args.json)
        elif args.command == "finetune":
            from seqapps import runner

            result = runner.finetune(args.name, args.from_path, args.data, args.overrides, args.strategy,
                                     verbose=interactive)
            _print_result(result if args.json else _summary(result), args.json)
        elif args.command == "predict":
            from seqapps import runner

            text, value = runner.predict(args.model, args.inputs)
            _print_result(value if args.json else text, args.json)
        elif args.command == "serve":
            from seqapps import serving

            serving.serve(args.model_root, args.host, args.port,
                          serving.ServingOptions(max_batch_size=args.max_batch_size,
                                                 batch_timeout_ms=args.batch_timeout_ms,
                                                 max_body_bytes=args.max_body_bytes))
        elif args.command == "bench":
            result = importlib.import_module(args.bench_module).run(args)
            _print_result(result, args.json)
    except SeqappsError as error:
        print(f"seqapps: error: {error}", file=sys.stderr)
        return 2
    except TrainingError as error:
        print(f"seqapps: training failed: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("seqapps: interrupted; run the same command again to resume from the last checkpoint",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
