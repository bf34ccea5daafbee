"""The ``seqapps`` command line.

Exit codes: 0 ok; 2 bad usage or bad input (one line naming what and where);
1 other failures. With ``--json`` the last line of stdout is one JSON object.
TensorFlow is imported only by the commands that need it, after the names and
files they were given are checked. Its C++ start-up messages are kept out of the
terminal unless ``--verbose`` (or a crash) asks for them.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import logging
import os
import sys
import tempfile
import warnings
from typing import Any, Iterator, Sequence

from seqapps import __version__
from seqapps.errors import SeqappsError, TrainingError

BENCHMARKS = {"bnce": "seqapps.bench.bnce", "hrnn": "seqapps.bench.hrnn", "serve": "seqapps.bench.serve",
              "rows": "seqapps.bench.rows", "speech": "seqapps.bench.speech"}
NATIVE_LOG_COMMANDS = ("run", "finetune", "predict", "report")  # the commands whose TensorFlow start-up noise is held back


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (and a JSON line with ``--json``)."""

    #: set by ``build_parser``: usage errors come before the parsed ``--json`` exists.
    json_errors = False

    def error(self, message: str) -> None:  # type: ignore[override]
        _fail(f"{self.prog}: error", f"{message} (see {self.prog} --help)", 2, _Parser.json_errors)
        raise SystemExit(2)


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config field (repeatable)")
    parser.add_argument("--strategy", default="auto", choices=["auto", "mirrored", "multiworker"],
                        help="tf.distribute strategy (multiworker reads TF_CONFIG)")
    parser.add_argument("--logdir", default=None, metavar="DIR",
                        help="where the run folder goes: DIR/NAME/VERSION, TensorBoard logs and report.html "
                             "(default: runs, beside the export root)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--verbose", action="store_true",
                        help="show TensorFlow's own start-up and warning messages")


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """Returns the argument parser for all subcommands; ``argv`` selects which benchmark's options to load."""
    _Parser.json_errors = "--json" in argv
    parser = _Parser(prog="seqapps", description=__doc__.splitlines()[0])
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

    predict = commands.add_parser("predict", help="run an export's serving signature on raw input",
                                  formatter_class=argparse.RawDescriptionHelpFormatter,
                                  epilog=_predict_inputs_help() if argv[:1] == ["predict"] else None)
    predict.add_argument("model", metavar="MODEL_DIR", help="saved_models/NAME[/VERSION]")
    predict.add_argument("inputs", nargs="+", metavar="INPUT")
    predict.add_argument("--signature", default="serving_default", metavar="NAME",
                         help="the signature to call (default: serving_default)")
    predict.add_argument("--set", dest="overrides", action="append", default=[], metavar="INPUT=VALUE",
                         help="set one signature input for every row, e.g. temperature=0.5 (repeatable)")
    predict.add_argument("--json", action="store_true")
    predict.add_argument("--verbose", action="store_true", help="show TensorFlow's own messages")

    report = commands.add_parser("report", help="build a run's report.html again from what the run saved")
    report.add_argument("path", metavar="RUN_DIR_OR_EXPORT", help="runs/NAME/VERSION or saved_models/NAME/VERSION")
    report.add_argument("--logdir", default=None, metavar="DIR",
                        help="where an export's run folder is (default: runs, beside the export root)")
    report.add_argument("--refresh", action="store_true",
                        help="collect the pipeline's figure data again from the export (for an export made before "
                             "its pipeline drew them); reads the data it was trained on")
    report.add_argument("--data", default=None, help="with --refresh: the data the export was trained on "
                                                     "(default: the embedded data set)")
    report.add_argument("--verbose", action="store_true", help="show TensorFlow's own messages")
    report.add_argument("--json", action="store_true")

    serve = commands.add_parser(
        "serve", help="serve saved_models/NAME/VERSION over TF Serving's REST API (predict, classify, regress)",
        description="Serves the latest version of every saved_models/NAME/ over TF Serving's REST API: status, "
                    "metadata, :predict, and :classify and :regress on the classify and regress signatures "
                    "(pixel_mnist and music_tagging's 'classify', the forecasting pipelines' 'regress').")
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
    serve.add_argument("--request-timeout-s", type=float, default=60.0,
                       help="deadline of one request; past it the model call is stopped and 504 answered "
                            "(default: 60)")
    serve.add_argument("--max-request-rows", type=int, default=1024,
                       help="rows per request, for exports whose limits.json sets none (default: 1024)")
    serve.add_argument("--max-string-bytes", type=int, default=64 * 1024,
                       help="bytes per string element, for exports whose limits.json sets none (default: 64 KiB)")
    serve.add_argument("--max-generated-length", type=int, default=4096,
                       help="largest 'length' input, for exports whose limits.json sets none (default: 4096)")
    serve.add_argument("--header-timeout-s", type=float, default=10.0,
                       help="close connections that do not finish their headers in time (default: 10)")
    serve.add_argument("--idle-timeout-s", type=float, default=30.0,
                       help="close idle keep-alive connections after this (default: 30)")
    serve.add_argument("--drain-seconds", type=float, default=10.0,
                       help="on SIGTERM/Ctrl-C, let requests in flight finish this long (default: 10)")
    serve.add_argument("--version-labels", default=None, metavar="FILE",
                       help="YAML/JSON file MODEL: {LABEL: VERSION} for /labels/LABEL (reread on every poll)")
    serve.add_argument("--grpc-port", type=int, default=None,
                       help="also serve TF Serving's gRPC API on this port: Predict, Classify, Regress, "
                            "MultiInference, GetModelMetadata and GetModelStatus; HandleReloadConfigRequest is "
                            "refused, the models are the model root's folders (TF Serving uses 8500; 0: a free one)")

    bench = commands.add_parser("bench", help="speed and memory benchmarks")
    benches = bench.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, module in BENCHMARKS.items():
        sub = benches.add_parser(name, help=f"benchmark {name}")
        sub.add_argument("--json", action="store_true")
        sub.set_defaults(bench_module=module)
        if list(argv[:2]) == ["bench", name]:  # import a benchmark only when it runs
            importlib.import_module(module).add_arguments(sub)
    return parser


def _predict_inputs_help() -> str:
    """What INPUT is for each registered pipeline (read from the registry, without importing TensorFlow)."""
    from seqapps.pipeline import REGISTRY

    names = REGISTRY.names()
    width = max(map(len, names), default=0)
    return "INPUT, by the export's pipeline:\n" + "\n".join(
        f"  {name:<{width}}  {REGISTRY.predict_input(name)}" for name in names)


def _print_result(result: Any, as_json: bool) -> None:
    if isinstance(result, str):
        print(result)
        return
    from seqapps.runner import json_safe

    nulls: dict[str, str] = {}
    safe = json_safe(result, nulls)
    if nulls and isinstance(safe, dict):
        safe["nulls"] = {**safe.get("nulls", {}), **nulls}
    print(json.dumps(safe, default=str, allow_nan=False, indent=None if as_json else 2))


def _fail(prefix: str, message: str, exit_code: int, as_json: bool) -> int:
    """Prints a failure as one stderr line and, with ``--json``, as the last stdout line; returns the code."""
    print(f"{prefix}: {message}", file=sys.stderr)
    if as_json:
        print(json.dumps({"error": message, "exit_code": exit_code}), flush=True)
    return exit_code


@contextlib.contextmanager
def native_stderr_to_file(enabled: bool) -> Iterator[io.BufferedRandom | None]:
    """Sends what C++ libraries write to file descriptor 2 into a temporary file.

    TensorFlow prints start-up messages from C++ at import and at its first ops
    (absl's "All log messages before absl::InitializeLog()", oneDNN notices), which
    no environment variable silences in TF 2.21. Python's ``sys.stderr`` keeps
    writing to the terminal; Python warnings and TensorFlow's Python log (the
    "tensorflow" logger: retracing notices and the like) go to the file as well.

    Args:
        enabled: when False, nothing is redirected.

    Yields:
        The temporary file (None when disabled); ``replay_native_stderr`` prints it.
    """
    if not enabled:
        yield None
        return
    sys.stderr.flush()
    log = tempfile.TemporaryFile()
    saved_fd = os.dup(2)
    python_stderr, show_warning = sys.stderr, warnings.showwarning
    try:
        uses_fd2 = sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):  # a test's capture object, not a real file
        uses_fd2 = False
    os.dup2(log.fileno(), 2)
    if uses_fd2:
        sys.stderr = io.TextIOWrapper(os.fdopen(os.dup(saved_fd), "wb", buffering=0), encoding=python_stderr.encoding,
                                      errors="backslashreplace", line_buffering=True)
    warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: log.write(
        warnings.formatwarning(message, category, filename, lineno, line).encode())
    tensorflow_log = _RecordsToFile(log)
    logging.getLogger("tensorflow").addFilter(tensorflow_log)
    try:
        yield log
    finally:
        logging.getLogger("tensorflow").removeFilter(tensorflow_log)
        warnings.showwarning = show_warning
        if uses_fd2:
            sys.stderr.flush()
            sys.stderr = python_stderr
        os.dup2(saved_fd, 2)
        os.close(saved_fd)


class _RecordsToFile(logging.Filter):
    """A logger filter that writes every record to a binary file instead of the logger's handlers.

    Args:
        log: the file.
    """

    def __init__(self, log: io.BufferedRandom) -> None:
        super().__init__()
        self.log = log

    def filter(self, record: logging.LogRecord) -> bool:
        self.log.write(f"{record.levelname}:{record.name}:{record.getMessage()}\n".encode())
        return False


def replay_native_stderr(log: io.BufferedRandom | None) -> None:
    """Writes what ``native_stderr_to_file`` held back to stderr (after a crash)."""
    if log is None:
        return
    log.flush()
    log.seek(0)
    sys.stderr.write(log.read().decode("utf-8", "replace"))
    sys.stderr.flush()


def _summary(result: dict[str, Any]) -> str:
    """The terminal summary of a run: headline metrics beside the baselines, split counts, the export path."""
    from seqapps.pipeline import REGISTRY
    from seqapps.summary import run_summary

    return run_summary(result, REGISTRY.get(result["pipeline"]).headline_metrics)


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
    as_json = getattr(args, "json", False)
    quiet = args.command in NATIVE_LOG_COMMANDS and not args.verbose
    with native_stderr_to_file(quiet) as native_log:
        try:
            code = _command(args)
        except BaseException:
            replay_native_stderr(native_log)
            if as_json:
                print(json.dumps({"error": f"crashed: {sys.exc_info()[0].__name__}", "exit_code": 1}), flush=True)
            raise
    return code


def _progress(args: argparse.Namespace) -> str:
    """How training shows progress: a bar on a terminal, a line per epoch otherwise, nothing with --json."""
    if getattr(args, "json", False):
        return "none"
    return "bar" if sys.stdout.isatty() else "lines"


def _command(args: argparse.Namespace) -> int:
    """Runs the parsed command; returns its exit code."""
    as_json = getattr(args, "json", False)
    try:
        if args.command == "list":
            _list(args.json)
        elif args.command == "run":
            from seqapps import runner

            result = runner.run(args.name, args.preset, args.data, args.config, args.overrides, args.out,
                                args.strategy, progress=_progress(args), logdir=args.logdir)
            _print_result(result if args.json else _summary(result), args.json)
        elif args.command == "finetune":
            from seqapps import runner

            result = runner.finetune(args.name, args.from_path, args.data, args.overrides, args.strategy,
                                     progress=_progress(args), logdir=args.logdir)
            _print_result(result if args.json else _summary(result), args.json)
        elif args.command == "predict":
            from seqapps import runner

            text, value = runner.predict(args.model, args.inputs, args.signature, args.overrides)
            _print_result(value if args.json else text, args.json)
        elif args.command == "report":
            if args.refresh:
                from seqapps import runner

                path = runner.refresh_report(args.path, args.data, args.logdir)
            else:
                from seqapps.report import run_folder

                path = run_folder.rebuild(args.path, args.logdir)
            _print_result({"report": str(path)} if args.json else f"report: {path}", args.json)
        elif args.command == "serve":
            from seqapps.serving.app import serve
            from seqapps.serving.runner import ServingOptions

            serve(args.model_root, args.host, args.port,
                  ServingOptions(
                      max_batch_size=args.max_batch_size, batch_timeout_ms=args.batch_timeout_ms,
                      max_body_bytes=args.max_body_bytes, request_timeout_s=args.request_timeout_s,
                      max_request_rows=args.max_request_rows, max_string_bytes=args.max_string_bytes,
                      max_generated_length=args.max_generated_length,
                      header_timeout_s=args.header_timeout_s, idle_timeout_s=args.idle_timeout_s,
                      drain_seconds=args.drain_seconds, labels_file=args.version_labels,
                      grpc_port=args.grpc_port))
        elif args.command == "bench":
            result = importlib.import_module(args.bench_module).run(args)
            _print_result(result, args.json)
    except SeqappsError as error:
        return _fail("seqapps: error", str(error), 2, as_json)
    except TrainingError as error:
        return _fail("seqapps: training failed", str(error), 1, as_json)
    except KeyboardInterrupt:
        return _fail("seqapps", "interrupted; run the same command again to resume from the last checkpoint",
                     130, as_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
