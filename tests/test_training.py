"""The shared training loop: a killed run resumes to the same result, progress lines for logs,
global-norm clipping of sparse gradients equal to dense clipping, and the time budget.

Kills happen in subprocesses with ``os._exit`` (no clean-up runs, as with SIGKILL), from a
callback after an epoch's backup or from inside the export before its rename.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from seqapps import training
from seqapps.config import Seq2SeqConfig, TrainingConfig
from seqapps.errors import ConfigError
from seqapps.pipeline import Splits
from seqapps.training import batch_datasets, clip_by_global_norm, make_optimizer
from tests.tensorboard_events import scalars

pytestmark = pytest.mark.large

# Five epochs whose validation loss goes up and down, so that the plateau schedule (patience 1)
# halves the learning rate judged against an earlier epoch's best: a resumed run without that
# state ends elsewhere (measured with dropout 0: MAE 654.85 instead of 651.96).
# Dropout is on (the preset's 0.2): the state of its seed generators is part of the backup; without
# it the resumed run draws epoch 1's masks again (measured: MAE 350.47 instead of 351.76).
# shrinkage=none: one fit per run, so that the kill's epoch count is the final fit's (the default's rolling-origin
# refits are fits of their own, each with its own backup).
OVERRIDES = ["epochs=5", "steps_per_epoch=3", "learning_rate=0.02", "early_stopping_patience=3", "lr_patience=1",
             "shrinkage=none"]

SCRIPT = """
import json, os, sys
from seqapps import cli

# TensorFlow's C++ start-up lines (absl, oneDNN; printed on some CPUs whatever TF_CPP_MIN_LOG_LEVEL says)
# are held back as cli.main holds them back for the imports it makes itself.
with cli.native_stderr_to_file(True):
    import keras
    from seqapps import export, training

kill_after = int(os.environ.get("KILL_AFTER_EPOCH", "0"))
if kill_after:
    class DieAfterEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):  # runs after the backup of this epoch
            if epoch + 1 == kill_after:
                os._exit(3)

    shared_fit = training.fit
    training.fit = lambda *args, **kwargs: shared_fit(*args, **kwargs, extra_callbacks=[DieAfterEpoch()])
if os.environ.get("KILL_BEFORE_RENAME"):
    def die(staging, model_root):  # the export is complete in its hidden folder, not yet renamed
        print(json.dumps(json.loads((staging / "assets.extra" / "metrics.json").read_text())), flush=True)
        os._exit(4)

    export._rename_into_place = die
sets = [arg for item in json.loads(sys.argv[2]) for arg in ("--set", item)]
sys.exit(cli.main(["run", "load_forecasting", "--preset", "tiny", "--out", sys.argv[1], *sys.argv[3:], *sets]))
"""


def run_tiny(out, *options, **env):
    completed = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT), str(out), json.dumps(OVERRIDES),
                                *options], capture_output=True, text=True, timeout=600,
                               env={**os.environ, **{k: str(v) for k, v in env.items()}})
    lines = completed.stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if "--json" in options and lines else completed.stdout
    return completed.returncode, summary, completed.stderr


def test_killed_runs_resume_to_the_uninterrupted_result_to_the_last_digit(tmp_path):
    # The uninterrupted run prints what a log file gets (stdout is not a terminal): one line per epoch.
    code, printed, err = run_tiny(tmp_path / "whole")
    assert code == 0 and err == "", err
    lines = [line for line in printed.splitlines() if line.startswith("epoch ")]
    assert [line.split()[1] for line in lines] == [f"{epoch}/5" for epoch in range(1, 6)]
    assert all(word in lines[0] for word in ("loss", "val_loss", "lr", "elapsed", "eta"))
    assert "\x08" not in printed and "\r" not in printed  # no progress bar
    whole = json.loads((tmp_path / "whole" / "load_forecasting" / "1" / "assets.extra" / "metrics.json").read_text())
    val = [round(v, 4) for v in whole["training"]["loss_history"]]
    assert whole["training"]["epochs_run"] == 5, val

    killed = tmp_path / "killed"
    code, _, err = run_tiny(killed, "--json", KILL_AFTER_EPOCH=2)
    assert code == 3, err
    # Resumed after epoch 2, then killed again inside the export, before its rename.
    code, in_export, err = run_tiny(killed, "--json", KILL_BEFORE_RENAME=1)
    assert code == 4, err
    assert in_export["training"]["resumed_from_epoch"] == 2
    assert list(killed.glob("load_forecasting/.tmp-*")), "the killed export leaves its hidden folder"
    # The same command again: the backup was kept, so nothing is trained again.
    code, resumed, err = run_tiny(killed, "--json")
    assert code == 0, err
    assert resumed["training"]["resumed_from_epoch"] == 5
    assert resumed["export"] == str(killed / "load_forecasting" / "1")
    assert not list(killed.glob("load_forecasting/.tmp-*"))
    assert not (killed / "load_forecasting" / ".checkpoints").exists()
    # The three processes logged into one pending run folder, renamed after the export: each epoch once.
    assert list(scalars(Path(resumed["run_folder"]) / "train", "epoch_loss").values()) == \
        [np.float32(loss) for loss in whole["training"]["loss_history"]]
    # Same seed, same batches, same callback state: equal to the last digit, not approximately.
    for run in (in_export, resumed):
        assert run["metrics"] == whole["metrics"] and run["baseline"] == whole["baseline"]
        for key in ("epochs_run", "loss_history", "best_val_loss", "final_learning_rate"):
            assert run["training"][key] == whole["training"][key], key


@pytest.mark.parametrize("seed", [0, 42])  # seed 0 (TensorFlow's global seed 0) once crashed the data pipeline
@pytest.mark.parametrize("steps_per_epoch", [None, 5])
def test_epoch_batches_depend_on_seed_and_epoch_alone(seed, steps_per_epoch):
    rows = np.arange(40, dtype="int32")
    data = Splits(*[tf.data.Dataset.from_tensor_slices(rows)] * 3, state={})
    config = TrainingConfig(seed=seed, epochs=4, batch_size=8, steps_per_epoch=steps_per_epoch)

    def batches(first_epoch):
        keras.utils.set_random_seed(seed)
        train, _, steps = batch_datasets(data, config, first_epoch=first_epoch)
        return [batch.numpy() for batch in train], steps

    whole, steps = batches(0)
    resumed, _ = batches(2)
    assert steps == 5 and len(whole) == 4 * steps
    assert all(np.array_equal(a, b) for a, b in zip(whole[2 * steps:], resumed, strict=True))
    epochs = [np.concatenate(whole[e * steps:(e + 1) * steps]) for e in range(4)]
    for epoch in epochs:  # 5 x 8 = 40: each epoch is a permutation of the rows
        np.testing.assert_array_equal(np.sort(epoch), rows)
    assert not np.array_equal(epochs[0], epochs[1])  # reshuffled every epoch


def _clips(count: int, seed: int) -> tuple[tf.data.Dataset, np.ndarray]:
    """Clip-like elements ({"waveform": id repeated, "length"}, label ids) of random lengths, and the lengths."""
    lengths = np.random.default_rng(seed).integers(1, 100, size=count).astype("int32")

    def clips():
        for i, length in enumerate(lengths):
            yield ({"waveform": np.full(length, i + 1, "float32"), "length": length},
                   np.zeros(length // 3 + 1, "int32"))

    spec = ({"waveform": tf.TensorSpec([None], tf.float32), "length": tf.TensorSpec([], tf.int32)},
            tf.TensorSpec([None], tf.int32))
    return tf.data.Dataset.from_generator(clips, output_signature=spec), lengths


def _ids(batch: dict) -> list[int]:
    """The element ids of a batch of ``_clips``, after checking that each row is its id, then zero padding."""
    ids = []
    for row, length in zip(batch["waveform"].numpy(), batch["length"].numpy()):
        assert np.all(row[:length] == row[0]) and np.all(row[length:] == 0)
        ids.append(int(row[0]))
    return ids


def test_length_grouped_batches_are_sorted_windows_cut_into_batches():
    elements, lengths = _clips(203, seed=3)  # 203: the last window and the last batch are partial
    batch_size, window_batches = 8, 4
    grouped = list(training.length_grouped_batches(elements.map(lambda inputs, labels: inputs), batch_size,
                                                   window_batches, seed=5))
    # NumPy: each window of 32 in stream order, sorted by length (the waveform's plus one for the scalar
    # length, as _element_lengths counts), stably, then cut into batches of 8.
    expected = []
    for start in range(0, len(lengths), batch_size * window_batches):
        window = np.arange(start, min(start + batch_size * window_batches, len(lengths)))
        ordered = window[np.argsort(lengths[window] + 1, kind="stable")] + 1
        expected += [sorted(ordered[i:i + batch_size].tolist()) for i in range(0, len(ordered), batch_size)]
    found = [sorted(_ids(batch)) for batch in grouped]
    assert len(found) == -(-203 // batch_size)  # as many batches as padded_batch makes
    assert sorted(found) == sorted(expected)
    assert found != expected  # the batches are shuffled, not in window order


def test_length_sorted_epochs_hold_every_element_once_and_pad_less():
    elements, lengths = _clips(203, seed=4)
    data = Splits(elements, elements, elements, state={})

    def epochs(window_batches: int, first_epoch: int = 0) -> tuple[list, int]:
        config = TrainingConfig(seed=42, epochs=3, batch_size=8, length_sorted_batches=window_batches)
        train, _, steps = batch_datasets(data, config, first_epoch=first_epoch)
        return [inputs for inputs, _ in train], steps

    grouped, steps = epochs(4)
    assert steps == 26 and len(grouped) == 3 * steps
    for epoch in range(3):
        ids = [i for batch in grouped[epoch * steps:(epoch + 1) * steps] for i in _ids(batch)]
        assert sorted(ids) == list(range(1, 204))
    resumed, _ = epochs(4, first_epoch=1)  # a resumed run sees the same batches
    for a, b in zip(grouped[steps:], resumed, strict=True):
        np.testing.assert_array_equal(a["waveform"].numpy(), b["waveform"].numpy())

    def padding(batches: list) -> float:
        return 1 - lengths.sum() / sum(int(tf.size(batch["waveform"])) for batch in batches[:steps])

    shuffled, _ = epochs(0)
    # measured: random batches of 8 lengths drawn from 1-99 pad 42.0 %; windows of 4 batches sorted, 17.7 %
    assert padding(grouped) < 0.5 * padding(shuffled)


def _sparse_and_dense() -> tuple[list, list]:
    """An embedding-like IndexedSlices gradient with duplicate rows, a dense one, and their dense forms."""
    rng = np.random.default_rng(0)
    indices = np.array([3, 1, 3, 3, 0, 1], "int32")  # rows 3 and 1 repeat
    values = rng.uniform(0.5, 1.5, size=(6, 4)).astype("float32")  # duplicates add up
    sparse = tf.IndexedSlices(tf.constant(values), tf.constant(indices), tf.constant([5, 4]))
    dense = tf.constant(rng.normal(size=(2, 3)).astype("float32"))
    return [sparse, dense], [tf.convert_to_tensor(sparse), dense]


def test_clipping_sparse_gradients_equals_dense_clipping():
    grads, dense = _sparse_and_dense()
    norm = float(tf.linalg.global_norm(dense))
    raw = float(np.sqrt(sum(np.sum(np.square(g.values if hasattr(g, "values") else g)) for g in grads)))
    assert abs(raw - norm) > 0.1 * norm  # the raw slices' norm is not the gradient's: the case that matters
    for clip_norm in (0.5 * norm, 2.0 * norm):  # clipped, and left alone
        expected, _ = tf.clip_by_global_norm(dense, clip_norm)
        clipped = clip_by_global_norm(grads, clip_norm)
        assert isinstance(clipped[0], tf.IndexedSlices)
        for a, b in zip(clipped, expected):
            # float32 sums of a few numbers in another order: round-off far below 1e-6.
            np.testing.assert_allclose(tf.convert_to_tensor(a).numpy(), b.numpy(), rtol=1e-6, atol=1e-6)
    xla = tf.function(lambda: clip_by_global_norm(grads, 0.5 * norm)[0].values, jit_compile=True)()
    np.testing.assert_allclose(xla.numpy(), clip_by_global_norm(grads, 0.5 * norm)[0].values.numpy(), rtol=1e-6)


def test_optimizer_step_with_sparse_gradients_equals_dense_step():
    grads, dense = _sparse_and_dense()
    norm = float(tf.linalg.global_norm(dense))
    results = []
    for given in (grads, dense):
        for name in ("sgd", "adam"):
            config = TrainingConfig(optimizer=name, learning_rate=0.1, clipnorm=0.5 * norm)
            variables = [keras.Variable(np.ones((5, 4), "float32")), keras.Variable(np.ones((2, 3), "float32"))]
            make_optimizer(config).apply(given, variables)
            results.append([v.numpy() for v in variables])
    for sparse_step, dense_step in zip(results[:2], results[2:]):
        for a, b in zip(sparse_step, dense_step):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # float32 round-off of one update


def _numpy_adam(variable, gradients, learning_rate, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
    """Kingma & Ba's Adam, the bias correction folded into the step size as Keras does."""
    m, v = np.zeros_like(variable), np.zeros_like(variable)
    for t, g in enumerate(gradients, start=1):
        m = beta_1 * m + (1 - beta_1) * g
        v = beta_2 * v + (1 - beta_2) * g * g
        variable = variable - learning_rate * np.sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t) * m / (np.sqrt(v) + epsilon)
    return variable


@pytest.mark.parametrize("jit_compile", [False, True])
def test_fused_adam_steps_equal_numpy_and_keras_adam(jit_compile):
    (sparse, dense), _ = _sparse_and_dense()
    steps = [[tf.IndexedSlices(sparse.values * (t + 1.0), sparse.indices, sparse.dense_shape), dense * (-1.0) ** t]
             for t in range(4)]  # growing and sign-flipping gradients, so that m and v both matter
    dense_steps = [[tf.convert_to_tensor(g) for g in step] for step in steps]
    start = [np.linspace(-1, 1, 20, dtype="float32").reshape(5, 4), np.ones((2, 3), "float32")]

    def train(optimizer, given):
        variables = [keras.Variable(value) for value in start]
        optimizer.build(variables)
        apply = tf.function(lambda grads: optimizer.apply(grads, variables), jit_compile=jit_compile)
        for grads in given:
            apply(grads)
        return [v.numpy() for v in variables]

    fused = train(make_optimizer(TrainingConfig(optimizer="adam", learning_rate=0.05, clipnorm=0)), steps)
    keras_adam = train(keras.optimizers.Adam(learning_rate=0.05), dense_steps)
    for index, (ours, theirs) in enumerate(zip(fused, keras_adam)):
        reference = _numpy_adam(start[index], [step[index].numpy() for step in dense_steps], 0.05)
        # float32 round-off of four updates of variables of size ~1: measured up to 1.3e-6 absolute.
        np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert not np.allclose(fused[0], start[0])  # the step moved the variables


def test_optimizer_round_trip():
    optimizer = make_optimizer(TrainingConfig(optimizer="adam", learning_rate=0.01, clipnorm=2.0))
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(restored) is type(optimizer) and restored.global_clipnorm == 2.0


def test_time_budget_stops_at_the_first_step_past_it(tmp_path, monkeypatch):
    clock, steps = [0.0], []
    monkeypatch.setattr(training.time, "perf_counter", lambda: clock[0])

    class TenSecondSteps(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            clock[0] += 10.0
            steps.append(batch)

    rng = np.random.default_rng(0)
    rows = tf.data.Dataset.from_tensor_slices((rng.normal(size=(8, 2)).astype("float32"),
                                               rng.normal(size=(8, 1)).astype("float32")))
    config = TrainingConfig(epochs=5, batch_size=4, early_stopping_patience=10, max_train_minutes=25 / 60)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=make_optimizer(config), loss="mse")
    # two steps per epoch; the third step ends at 30 s > 25 s: epoch 2 is cut after its first step
    report = training.fit(model, Splits(rows, rows, rows, state={}), config, tmp_path,
                          extra_callbacks=[TenSecondSteps()])
    assert steps == [0, 1, 0] and report["epochs_run"] == 2 and len(report["val_loss_history"]) == 2


@pytest.mark.parametrize("schedule", ["budget", "plateau"])
def test_the_budget_schedule_lowers_the_learning_rate_linearly_with_the_time_spent(tmp_path, monkeypatch, schedule):
    clock, rates = [0.0], []
    monkeypatch.setattr(training.time, "perf_counter", lambda: clock[0])

    class TenSecondSteps(keras.callbacks.Callback):  # after the schedule's callback: a step starts, then takes 10 s
        def on_train_batch_begin(self, batch, logs=None):
            rates.append(float(self.model.optimizer.learning_rate.numpy()))
            clock[0] += 10.0

    rng = np.random.default_rng(0)
    rows = tf.data.Dataset.from_tensor_slices((rng.normal(size=(8, 2)).astype("float32"),
                                               rng.normal(size=(8, 1)).astype("float32")))
    config = TrainingConfig(epochs=5, batch_size=4, early_stopping_patience=10, max_train_minutes=25 / 60,
                            learning_rate=0.064, lr_schedule=schedule, lr_patience=1)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=make_optimizer(config), loss="mse")
    report = training.fit(model, Splits(rows, rows, rows, state={}), config, tmp_path,
                          extra_callbacks=[TenSecondSteps()])
    # steps start at 0, 10 and 20 s of a 25 s budget: from 0.064 towards 0.001 (1/64), 0.4 and 0.8 of the way
    expected = [0.064, 0.064 - 0.4 * 0.063, 0.064 - 0.8 * 0.063] if schedule == "budget" else [0.064] * 3
    assert rates == pytest.approx(expected, rel=1e-6)
    assert report["final_learning_rate"] == pytest.approx(expected[-1], rel=1e-6)
    schedule = training.TrainingBudget(25.0, 0.064, 0.001)
    assert [schedule.rate(t) for t in (-1.0, 25.0, 100.0)] == pytest.approx([0.064, 0.001, 0.001])


def test_the_budget_schedule_without_a_budget_halves_the_rate_on_a_plateau(tmp_path):
    rows = tf.data.Dataset.from_tensor_slices((np.zeros((8, 2), "float32"), np.ones((8, 1), "float32")))
    config = TrainingConfig(epochs=3, batch_size=4, early_stopping_patience=10, lr_patience=1, learning_rate=0.5,
                            lr_schedule="budget", max_train_minutes=None)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, trainable=False)])  # a loss that cannot move
    model.compile(optimizer=make_optimizer(config), loss="mse")
    report = training.fit(model, Splits(rows, rows, rows, state={}), config, tmp_path)
    assert report["final_learning_rate"] == pytest.approx(0.125)  # halved after epochs 2 and 3
    with pytest.raises(ConfigError, match="'lr_schedule'"):
        TrainingConfig(lr_schedule="cosine", max_train_minutes=1.0).validate()


def test_tokens_per_second_counts_the_real_tokens_of_the_timed_batches(monkeypatch):
    """Tokens/s divides the timed batches' own non-padding tokens (not the split's mean) by the step time.

    Each step takes 2 s on a fake clock. The split is 4 rows of 3 real tokens, then 8 of 1: batches of
    4 give a traced batch of 12 tokens and 2 timed ones of 4 (the split's mean would say 6.7 per batch).
    """
    clock = [0.0]
    monkeypatch.setattr(training.time, "perf_counter", lambda: clock[0])

    weights = np.array([[1, 1, 1]] * 4 + [[1, 0, 0]] * 8, "float32")
    rows = tf.data.Dataset.from_tensor_slices((np.ones((12, 3), "float32"), np.zeros((12, 3), "float32"), weights))
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(3)(inputs))  # functional: the timing copies it by its config
    config = Seq2SeqConfig(batch_size=4, timing_steps=2, optimizer="sgd", learning_rate=0.0)
    real_train_on_batch = keras.Model.train_on_batch

    def train_on_batch(self, *batch):
        clock[0] += 2.0
        return real_train_on_batch(self, *batch)

    monkeypatch.setattr(keras.Model, "train_on_batch", train_on_batch)
    per_token = {"loss": lambda y_true, y_pred: tf.square(y_true - y_pred)}  # [batch, 3], as the weights
    data = Splits(rows, rows, rows, state={})
    assert training.training_tokens_per_second(model, config, per_token, data) == 2.0  # 4 tokens / 2 s
    assert training.seconds_per_training_step(model, config, per_token, data, 2) == 2.0


def test_timed_steps_exclude_tracing_a_new_batch_width(monkeypatch):
    """Batches of several widths (padded to their longest element) each trace the step once; the timing leaves
    that out. The fake step takes 2 s, plus 10 s the first time it sees a width."""
    clock, widths_seen = [0.0], set()
    monkeypatch.setattr(training.time, "perf_counter", lambda: clock[0])
    lengths = [1] * 4 + [2] * 4 + [3] * 4
    rows = tf.data.Dataset.from_generator(
        lambda: ((np.ones(n, "float32"), np.zeros(n, "float32"), np.ones(n, "float32")) for n in lengths),
        output_signature=(tf.TensorSpec([None], tf.float32),) * 3)
    inputs = keras.Input((None,))
    model = keras.Model(inputs, keras.layers.Rescaling(2.0)(inputs))
    config = Seq2SeqConfig(batch_size=4, timing_steps=2, optimizer="sgd", learning_rate=0.0)
    real_train_on_batch = keras.Model.train_on_batch

    def train_on_batch(self, *batch):
        width = int(batch[0].shape[1])
        clock[0] += 2.0 + (10.0 if width not in widths_seen else 0.0)
        widths_seen.add(width)
        return real_train_on_batch(self, *batch)

    monkeypatch.setattr(keras.Model, "train_on_batch", train_on_batch)
    per_token = {"loss": lambda y_true, y_pred: tf.square(y_true - y_pred)}
    data = Splits(rows, rows, rows, state={})
    assert training.seconds_per_training_step(model, config, per_token, data, 2) == 2.0
    assert widths_seen == {1, 2, 3}  # three widths: the timed batches were not all the traced one's


@pytest.mark.parametrize("progress", ["lines", "bar"])
def test_a_labelled_fit_names_itself_before_its_epochs(tmp_path, capsys, progress):
    """A run that trains more than once (forecasting's shrinkage origins, then the final fit) says which fit is which."""
    rng = np.random.default_rng(0)
    rows = tf.data.Dataset.from_tensor_slices((rng.normal(size=(8, 2)).astype("float32"),
                                               rng.normal(size=(8, 1)).astype("float32")))
    config = TrainingConfig(epochs=2, batch_size=4, early_stopping_patience=10)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=make_optimizer(config), loss="mse")
    training.fit(model, Splits(rows, rows, rows, state={}), config, tmp_path, progress=progress,
                 label="shrinkage origin 1/3")
    printed = capsys.readouterr().out.splitlines()
    if progress == "lines":  # a log file: every epoch line carries the label
        assert [line.split()[:5] for line in printed] == [
            ["shrinkage", "origin", "1/3:", "epoch", f"{epoch}/2"] for epoch in (1, 2)]
    else:  # Keras' bar prints its own "Epoch 1/2" lines: a heading above them
        assert printed[0] == "shrinkage origin 1/3:" and printed[1] == "Epoch 1/2"


def test_an_epoch_metric_beyond_float32_is_logged_as_infinity(tmp_path):
    """A diverging language model's perplexity (4e100, a valid double) crashed TensorBoard's float32 summary."""
    rng = np.random.default_rng(0)
    rows = tf.data.Dataset.from_tensor_slices((rng.normal(size=(8, 2)).astype("float32"),
                                               rng.normal(size=(8, 1)).astype("float32")))
    config = TrainingConfig(epochs=1, batch_size=4, early_stopping_patience=10)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=make_optimizer(config), loss="mse")
    report = training.fit(model, Splits(rows, rows, rows, state={}), config, tmp_path / "backup",
                          log_dir=tmp_path / "logs", epoch_metrics=lambda trained: {"ppl": 3.9e100, "small": 2.5})
    assert report["history"]["val_ppl"] == [np.inf] and report["history"]["val_small"] == [2.5]
    validation = tmp_path / "logs" / "validation"
    assert scalars(validation, "epoch_ppl") == {0: np.inf} and scalars(validation, "epoch_small") == {0: 2.5}
