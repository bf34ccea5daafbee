"""tf.distribute through the shared training loop.

MirroredStrategy over two logical CPUs, and MultiWorkerMirroredStrategy with two worker
processes on 127.0.0.1 (training together, exporting once, resuming after a kill).
Each run happens in subprocesses: a strategy must be created before other TensorFlow work.
"""
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.large, pytest.mark.long_fixtures]
OVERRIDES = ["epochs=2", "steps_per_epoch=3", "batch_size=32"]

# Same data order under every strategy: TF rewrites a dataset when it distributes it, and a seeded
# shuffle then yields another order, so the comparisons batch without shuffling.
UNSHUFFLED = """
from seqapps import training
training.batch_datasets = lambda data, config, first_epoch=0: (
    data.train.repeat().padded_batch(config.batch_size, padding_values=data.padding_values),
    data.val.padded_batch(config.batch_size, padding_values=data.padding_values), config.steps_per_epoch)
"""


def run_in_subprocess(code: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=timeout)


def last_json_line(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


# Each pipeline's tiny preset under mirrored, with its overrides. weather_forecasting chooses its shrinkage on
# rolling-origin refits (several fits in one run) on the two workers below; here it fits once.
EVERY_OTHER_PIPELINE = {"weather_forecasting": ["shrinkage=none"], "language_model": [], "text_generation": [],
                        "copy_task": [], "pixel_mnist": [], "hrnn_char_lm": []}
# On two workers: every kind of training step. pixel_mnist is left out there: it trains the HRNN model of
# copy_task in the same (periodic) mode, only on longer sequences.
ON_TWO_WORKERS = ["weather_forecasting", "language_model", "text_generation", "copy_task", "hrnn_char_lm"]
# gr_hrnn: the HRNN's own train_step with the recomputed segment gradients, and no random
# decoder draws; dropout=0 for the same reason: random draws differ between one batch and two
# half batches. shrinkage=none: one fit per run, the one compared (weather_forecasting, in
# ON_TWO_WORKERS, still chooses its shrinkage on rolling-origin refits).
COMPARED = {"load_forecasting": ["dropout=0", "shrinkage=none"], "copy_task": ["mode=gr_hrnn"]}


@pytest.fixture(scope="module")
def mirrored_runs(tmp_path_factory) -> dict:
    """One process over two logical CPUs (the strategy needs them before other TensorFlow work) runs:

    each ``COMPARED`` pipeline, unshuffled, under ``auto`` and then under ``mirrored``; then, with the
    shared batching back, every other pipeline's tiny preset under ``mirrored``.

    Returns:
        ``{"exports": {name: export}, "results": {name: {strategy: run result}}, "replicas": count,
        "out": the export root}``.
    """
    out = tmp_path_factory.mktemp("mirrored")
    code = f"""
        import json
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        from seqapps import runner, training
        shared_batching = training.batch_datasets
        {textwrap.indent(UNSHUFFLED, " " * 8).strip()}
        results = {{pipeline: {{strategy: runner.run(pipeline, "tiny", overrides={OVERRIDES!r} + extra,
                                                  out={str(out)!r} + "/" + strategy, strategy=strategy)
                              for strategy in ("auto", "mirrored")}}
                   for pipeline, extra in {COMPARED!r}.items()}}
        training.batch_datasets = shared_batching
        exports = {{name: runner.run(name, "tiny", out={str(out / "every")!r}, strategy="mirrored",
                                    overrides=extra)["export"]
                   for name, extra in {EVERY_OTHER_PIPELINE!r}.items()}}
        replicas = tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])
        print(json.dumps({{"exports": exports, "results": results, "replicas": replicas.num_replicas_in_sync}}))
    """
    completed = run_in_subprocess(code, timeout=1800)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return {**last_json_line(completed.stdout), "out": out}


@pytest.mark.parametrize("pipeline", sorted(COMPARED))
def test_mirrored_over_two_cpus_matches_the_default_strategy(mirrored_runs, pipeline):
    assert mirrored_runs["replicas"] == 2
    auto, mirrored = (mirrored_runs["results"][pipeline][strategy]["training"]["loss_history"]
                      for strategy in ("auto", "mirrored"))
    assert len(auto) == len(mirrored) == 2
    # Same global batch, seed and data: only float summation order differs (all-reduce of two
    # half-batch gradients); measured 1e-7 relative over six steps, so 1e-4 leaves room.
    assert auto == pytest.approx(mirrored, rel=1e-4)


def test_every_pipeline_trains_under_mirrored(mirrored_runs):
    every = mirrored_runs["out"] / "every"
    assert mirrored_runs["exports"] == {name: str(every / name / "1") for name in EVERY_OTHER_PIPELINE}


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


WORKER = """
import json, os, sys
from seqapps import training
{unshuffled}
kill_at_epoch = int(os.environ.get("KILL_AT_EPOCH", "0"))
if kill_at_epoch:
    import keras

    class DieAfterEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):  # runs after BackupAndRestore saved this epoch
            if epoch + 1 == kill_at_epoch:
                os._exit(3)

    shared_fit = training.fit
    training.fit = lambda *args, **kwargs: shared_fit(*args, **kwargs, extra_callbacks=[DieAfterEpoch()])
from seqapps import cli
# One cluster trains them in turn (make_strategy returns the same strategy), each with its own overrides.
for pipeline, overrides in json.loads(sys.argv[2]):
    sets = [arg for item in overrides for arg in ("--set", item)]
    code = cli.main(["run", pipeline, "--preset", "tiny", "--strategy", "multiworker", "--out", sys.argv[1],
                     "--json", *sets])
    if code:
        sys.exit(code)
"""


def start_workers(out: Path, runs: list[tuple[str, list[str]]], kill_index: int | None = None,
                  kill_at_epoch: int = 0) -> list[subprocess.Popen]:
    """Starts two workers of one MultiWorkerMirroredStrategy cluster on loopback, to do ``runs`` in turn.

    Args:
        out: the export root.
        runs: ``(pipeline, its key=value overrides of the tiny preset)`` pairs.
        kill_index: the worker that exits (code 3) after epoch ``kill_at_epoch``, if any.
        kill_at_epoch: that epoch.
    """
    addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
    code = WORKER.format(unshuffled=UNSHUFFLED)
    workers = []
    for index in range(2):
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
               "TF_CONFIG": json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}})}
        if index == kill_index:
            env["KILL_AT_EPOCH"] = str(kill_at_epoch)
        command = [sys.executable, "-c", code, str(out), json.dumps(runs)]
        workers.append(subprocess.Popen(command, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    return workers


def finish(workers: list[subprocess.Popen]) -> list[dict]:
    """Waits for both workers and returns the result of each one's last run."""
    return [runs[-1] for runs in finish_runs(workers)]


def finish_runs(workers: list[subprocess.Popen], timeout: float = 600) -> list[list[dict]]:
    """Waits for both workers and returns each one's run results, in order (the JSON lines of its stdout)."""
    results = []
    for worker in workers:
        stdout, stderr = worker.communicate(timeout=timeout)
        assert worker.returncode == 0, stderr[-3000:]
        results.append([json.loads(line) for line in stdout.splitlines() if line.startswith('{"pipeline"')])
    return results


@pytest.fixture(scope="module")
def two_worker_runs(tmp_path_factory) -> dict:
    """One two-worker cluster runs load_forecasting (the comparison settings of ``mirrored_runs``), then
    the tiny preset of each pipeline in ``ON_TWO_WORKERS``.

    Returns:
        ``{"out": the export root, "chief": [its run results], "worker": [its run results]}``, in run order.
    """
    out = tmp_path_factory.mktemp("multi")
    runs = [("load_forecasting", OVERRIDES + COMPARED["load_forecasting"]),
            *((name, []) for name in ON_TWO_WORKERS)]
    chief, worker = finish_runs(start_workers(out, runs), timeout=1800)
    return {"out": out, "chief": chief, "worker": worker}


def test_two_workers_train_together_and_the_chief_exports_once(two_worker_runs, mirrored_runs):
    out = two_worker_runs["out"]
    chief, worker = two_worker_runs["chief"][0], two_worker_runs["worker"][0]
    assert chief["pipeline"] == worker["pipeline"] == "load_forecasting"
    assert chief["export"] == str(out / "load_forecasting" / "1")
    assert worker["export"] is None
    assert sorted(p.name for p in (out / "load_forecasting").iterdir()) == ["1"]
    # The workers agree, and they match one process at the same global batch (the default strategy's run of
    # the same settings in mirrored_runs): each step's global batch is split between them and their
    # gradients summed. Float summation order differs.
    assert chief["training"]["loss_history"] == worker["training"]["loss_history"]
    timings = ("train_tokens_per_s", "train_seconds_per_epoch")  # the language model's speed report
    assert ({k: v for k, v in chief["metrics"].items() if k not in timings}
            == {k: v for k, v in worker["metrics"].items() if k not in timings})
    one = mirrored_runs["results"]["load_forecasting"]["auto"]
    assert chief["training"]["loss_history"] == pytest.approx(one["training"]["loss_history"], rel=1e-4)
    assert chief["metrics"]["mae"] == pytest.approx(one["metrics"]["mae"], rel=1e-3)


def test_a_killed_worker_resumes_from_its_backup(tmp_path):
    # shrinkage=none: one fit, so that the kill hits the final fit (the rolling-origin refits have backups of their own)
    overrides = ["epochs=4", "steps_per_epoch=3", "batch_size=16", "early_stopping_patience=10", "shrinkage=none"]
    chief, victim = start_workers(tmp_path, [("load_forecasting", overrides)], kill_index=1, kill_at_epoch=2)
    assert victim.wait(timeout=600) == 3, victim.stderr.read()[-3000:]
    # The survivor's next collective fails once the dead peer misses its heartbeats (about 10 s here):
    # one line that says what to do, exit code 1.
    _, stderr = chief.communicate(timeout=300)
    assert chief.returncode == 1, stderr[-3000:]
    error = stderr.strip().splitlines()[-1]
    assert error.startswith("seqapps: training failed: another worker stopped") and "task:1" in error
    assert "start every worker again with the same command" in error
    backups = tmp_path / "load_forecasting" / ".checkpoints"
    saved = {p.parent.name: json.loads(p.read_text())["epoch"] for p in backups.glob("*/training_metadata.json")}
    chief_epoch = saved.pop(next(name for name in saved if "-worker-" not in name))
    # Worker 1 saved epoch 2 before dying; the chief may have been killed before saving it.
    assert saved == {next(iter(saved)): 2} and next(iter(saved)).endswith("-worker-1")
    assert chief_epoch in (1, 2)

    chief, worker = finish(start_workers(tmp_path, [("load_forecasting", overrides)]))
    for result in (chief, worker):  # both resume from the chief's backup, so they stay in step
        assert result["training"]["resumed_from_epoch"] == chief_epoch
        assert len(result["training"]["loss_history"]) == 4  # the epochs before the kill come from the backup
    assert chief["export"] == str(tmp_path / "load_forecasting" / "1") and worker["export"] is None
    assert not backups.exists()  # both workers' backups are removed once the export is in place


def test_every_pipeline_trains_on_two_workers(two_worker_runs):
    out, chief_runs, worker_runs = two_worker_runs["out"], two_worker_runs["chief"][1:], two_worker_runs["worker"][1:]
    assert [run["pipeline"] for run in chief_runs] == [run["pipeline"] for run in worker_runs] == ON_TWO_WORKERS
    timings = ("train_tokens_per_s", "train_seconds_per_epoch")  # the language model's speed report
    for chief, worker in zip(chief_runs, worker_runs):
        pipeline = chief["pipeline"]
        assert chief["export"] == str(out / pipeline / "1") and worker["export"] is None, pipeline
        assert chief["training"]["loss_history"] == worker["training"]["loss_history"], pipeline
        assert ({k: v for k, v in chief["metrics"].items() if k not in timings}
                == {k: v for k, v in worker["metrics"].items() if k not in timings}), pipeline
