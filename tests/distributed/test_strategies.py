"""tf.distribute through the shared training loop: MirroredStrategy over two logical CPUs."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.large
OVERRIDES = ["--set", "epochs=2", "--set", "steps_per_epoch=3", "--set", "batch_size=32"]


def run_in_subprocess(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}, timeout=600)


def test_mirrored_over_two_cpus_matches_the_default_strategy(tmp_path):
    code = f"""
        import json, sys
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        from seqapps import runner, training

        # Same data order under both strategies: TF rewrites a dataset when it distributes it, and a
        # seeded shuffle then yields another order, so the comparison batches without shuffling.
        training.batch_datasets = lambda data, config: (data.train.repeat().batch(config.batch_size),
                                                        data.val.batch(config.batch_size))
        overrides = {OVERRIDES[1::2]!r}
        curves = {{}}
        for strategy in ("auto", "mirrored"):
            result = runner.run("load_forecasting", "tiny", overrides=overrides, out={str(tmp_path)!r} + "/" + strategy,
                                strategy=strategy)
            curves[strategy] = result["training"]["loss_history"]
        replicas = tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])
        print(json.dumps({{"curves": curves, "replicas": replicas.num_replicas_in_sync}}))
    """
    completed = run_in_subprocess(code)
    assert completed.returncode == 0, completed.stderr[-3000:]
    answer = json.loads(completed.stdout.strip().splitlines()[-1])
    assert answer["replicas"] == 2
    auto, mirrored = answer["curves"]["auto"], answer["curves"]["mirrored"]
    assert len(auto) == len(mirrored) == 2
    # Same global batch, seed and data: only float summation order differs (all-reduce of two
    # half-batch gradients); measured 1e-7 relative over six steps, so 1e-4 leaves room.
    assert auto == pytest.approx(mirrored, rel=1e-4)
