"""Benchmark of the speech CTC model's training memory and step time on long utterances: BiRNN vs HRNN encoders.

One training step (``CTCSpeechModel.train_step``: features, encoder, CTC loss,
gradients, Adam update) of the ``speech_recognition`` model at a preset's sizes,
with the bidirectional encoder (plain autodiff), with ``encoder=hrnn`` (the
``DecoupledHRNN`` in its memory-lean mode) and with ``encoder=bihrnn`` (a
``BidirectionalHRNN``: that layer each way, each direction lean), on a batch of synthetic utterances of
each length: seeded noise at 16 kHz and random transcripts of
``--chars-per-second`` characters. Each measurement runs in a fresh process; the
harness (``seqapps.bench.steps``) reports the peak RSS during the steps minus the
RSS just before the first one. The CTC loss's own forward-backward tables
(batch x frames x (2 x characters + 1)) and the log-mel features are in both
encoders' figures.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from seqapps.bench import steps as steps_harness
from seqapps.errors import ConfigError

ENCODERS = ("birnn", "hrnn", "bihrnn")
HRNN_ENCODERS = ("hrnn", "bihrnn")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the benchmark's options to ``parser``.

    Args:
        parser: the (sub)command parser.
    """
    parser.add_argument("--seconds", default="5,20,60", help="comma-separated utterance lengths (seconds)")
    parser.add_argument("--encoders", default="birnn,hrnn", help=f"comma-separated, of {', '.join(ENCODERS)}")
    parser.add_argument("--preset", default="default", help="the speech_recognition preset whose sizes to use")
    parser.add_argument("--batch", type=int, default=8, help="utterances per batch")
    parser.add_argument("--steps", type=int, default=3, help="training steps per measurement")
    parser.add_argument("--chars-per-second", type=float, default=15.0, help="transcript length per second")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and data")
    parser.add_argument("--hrnn-units", default="", help="units of the HRNN encoders' levels, comma-separated "
                        "(e.g. 124,124 to match a BiGRU of 128,128 in parameters); default: the preset's units")
    parser.add_argument("--birnn-units", default="", help="units per direction of the BiGRU's layers, "
                        "comma-separated (e.g. 128,128, the default preset's until 6 December); default: the preset's")


def measure(encoder: str, seconds: float, preset: str, batch: int, steps: int, chars_per_second: float,
            seed: int, hrnn_units: str = "", birnn_units: str = "") -> dict[str, Any]:
    """Trains ``steps`` steps of the speech model in this process and returns its memory and times.

    Args:
        encoder: one of ``ENCODERS``.
        seconds: the length of every utterance.
        preset: the ``speech_recognition`` preset.
        batch: utterances per batch.
        steps: training steps.
        chars_per_second: transcript characters per second of audio.
        seed: seed of the weights and data.
        hrnn_units: comma-separated units per level of an HRNN encoder ("": the preset's).
        birnn_units: comma-separated units per layer of the birnn encoder ("": the preset's).

    Returns:
        The harness's ``{"memory_mb", "step_s", "first_step_s", "trace_s", "device"}``
        plus ``frames`` (the encoder's time steps) and ``parameters``.
    """
    import keras
    import numpy as np
    import tensorflow as tf

    from seqapps import training
    from seqapps.config import resolve_config
    from seqapps.data import speech
    from seqapps.pipeline import REGISTRY, Splits

    keras.utils.set_random_seed(seed)
    pipeline = REGISTRY.get("speech_recognition")()
    config = resolve_config(pipeline.Config, preset, overrides=encoder_overrides(encoder, hrnn_units, birnn_units))
    chars = ["", *sorted(set(speech.SPOKEN_CHARS))]  # the generated corpus's character set, as load_data makes it
    state = {"chars": chars, "sample_rate": speech.SAMPLE_RATE}
    model = training.build_and_compile(pipeline, config, Splits(None, None, None, state=state),
                                       tf.distribute.get_strategy())
    model.optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(seed)
    samples = int(seconds * speech.SAMPLE_RATE)
    inputs = {"waveform": tf.constant(rng.normal(0.0, 0.1, (batch, samples)).astype(np.float32)),
              "length": tf.constant([samples] * batch, tf.int32)}
    labels = tf.constant(rng.integers(1, len(chars), (batch, round(chars_per_second * seconds))), tf.int32)

    @tf.function
    def train_step(inputs: dict[str, tf.Tensor], labels: tf.Tensor) -> tf.Tensor:
        return model.train_step((inputs, labels))["loss"]

    forward = tf.function(lambda inputs: model(inputs, training=False))
    result = steps_harness.measure_steps(train_step, (inputs, labels), lambda: forward(inputs).numpy(), steps)
    frames = int(model.output_lengths(inputs["length"])[0])
    return {**result, "frames": frames, "parameters": model.count_params()}


def encoder_overrides(encoder: str, hrnn_units: str = "", birnn_units: str = "") -> list[str]:
    """The ``speech_recognition`` config overrides of one measurement: the encoder, and its units if given.

    Args:
        encoder: one of ``ENCODERS``.
        hrnn_units, birnn_units: ``parse_units``' values; each applies to its own encoders only.

    Returns:
        ``key=value`` overrides.
    """
    units = hrnn_units if encoder in HRNN_ENCODERS else birnn_units
    return [f"encoder={encoder}", *([f"units=[{units}]"] if units else [])]


#: option -> (the fewest levels or layers its encoder takes, the word for one, an example)
UNITS_OPTIONS = {"--hrnn-units": (2, "HRNN level", "124,124"), "--birnn-units": (1, "BiGRU layer", "128,128")}


def parse_units(text: str, option: str) -> str:
    """Checks ``--hrnn-units`` or ``--birnn-units`` before any measurement starts.

    Args:
        text: the option's value: comma-separated units per HRNN level or BiGRU layer, or "" for the preset's.
        option: a key of ``UNITS_OPTIONS``.

    Returns:
        The units joined by commas without spaces ("" for the preset's).

    Raises:
        ConfigError: the value is not comma-separated integers >= 1, as many as the encoder needs.
    """
    if not text.strip():
        return ""
    try:
        units = [int(item) for item in text.split(",")]
    except ValueError:
        units = []
    fewest, each, example = UNITS_OPTIONS[option]
    if len(units) < fewest or min(units) < 1:
        raise ConfigError(f"{option}: got {text!r}, expected {'two' if fewest == 2 else 'one'} or more "
                          f"comma-separated integers >= 1 (one per {each}, e.g. {example})")
    return ",".join(str(unit) for unit in units)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Runs every measurement and returns the JSON-able report.

    Args:
        args: the parsed options of ``add_arguments``.

    Returns:
        ``{"config", "results"}``: one row per utterance length with, per encoder,
        its memory (MiB), step time (s) and parameters, and the memory ratio birnn / each HRNN encoder.
    """
    encoders = [e.strip() for e in args.encoders.split(",")]
    unknown = set(encoders) - set(ENCODERS)
    if unknown:
        raise ConfigError(f"--encoders: unknown {sorted(unknown)}; expected some of {ENCODERS}")
    hrnn_units = parse_units(args.hrnn_units, "--hrnn-units")
    birnn_units = parse_units(args.birnn_units, "--birnn-units")
    rows = []
    for seconds in (float(s) for s in args.seconds.split(",")):
        row: dict[str, Any] = {"seconds": seconds}
        for encoder in encoders:
            result = steps_harness.run_worker("seqapps.bench.speech", {
                "encoder": encoder, "utterance_seconds": seconds, "preset": args.preset, "batch": args.batch,
                "steps": args.steps, "chars_per_second": args.chars_per_second, "seed": args.seed,
                "hrnn_units": hrnn_units, "birnn_units": birnn_units})
            row["frames"], row["device"] = result["frames"], result["device"]
            for key in ("memory_mb", "step_s", "parameters"):
                row[f"{encoder}_{key}"] = result[key]
        for hrnn in (e for e in HRNN_ENCODERS if "birnn" in encoders and e in encoders):
            ratio_key = "memory_ratio" if hrnn == "hrnn" else f"memory_ratio_{hrnn}"
            row[ratio_key] = round(row["birnn_memory_mb"] / max(row[f"{hrnn}_memory_mb"], 1e-3), 2)
        rows.append(row)
        print(row, file=sys.stderr, flush=True)
    config = {"preset": args.preset, "batch": args.batch, "steps": args.steps,
              "chars_per_second": args.chars_per_second, "seconds": args.seconds, "encoders": encoders,
              "hrnn_units": hrnn_units, "birnn_units": birnn_units}
    return {"config": config, "results": rows}


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m seqapps.bench.speech``: a worker, or the whole benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--worker", action="store_true", help="run one measurement and print it as JSON")
    parser.add_argument("--encoder", choices=ENCODERS, default="birnn", help="worker: the encoder")
    parser.add_argument("--utterance-seconds", type=float, default=5.0, help="worker: the utterance length")
    args = parser.parse_args(argv)
    if args.worker:
        result = measure(args.encoder, args.utterance_seconds, args.preset, args.batch, args.steps,
                         args.chars_per_second, args.seed, args.hrnn_units, args.birnn_units)
    else:
        result = run(args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
