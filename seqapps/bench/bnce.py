"""Benchmark of one output-layer training step: full softmax, S-NCE, B-NCE and adaptive B-NCE.

Each step computes the loss of a batch, its gradients w.r.t. the hidden states
and the output weights, and an SGD update of the output weights: sparse
(``scatter_sub`` of the ``IndexedSlices`` rows) for the sampled losses, dense
for the softmax. The methods are timed round-robin within one run, so their
ratios are comparable even when the shared machine's speed drifts.

S-NCE appears twice: "snce" is the dense ``B x (K + 1)`` formulation of
``seqapps.layers.batch_nce.sampled_nce_loss`` under XLA (the faster one, the
layer's choice), "snce_tf" is ``tf.nn.nce_loss`` with a fixed unigram sampler.
B-NCE does ``3 x B x B x H`` matmul FLOPs per step against S-NCE's
``3 x B x K x H``, so it trails the XLA-compiled dense S-NCE by about that
compute (about 1.5x at B=400, K=100 on 2 cores).
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from seqapps.errors import ConfigError
from seqapps.layers.batch_nce import (
    batch_nce_loss,
    noise_ids_from_uniform,
    sampled_nce_loss,
    softmax_loss,
)

METHODS = ("softmax", "snce", "snce_tf", "bnce", "adaptive_bnce")
# XLA per method in "auto" mode, from measurements on the 2-core CPU: it speeds up
# the sampled losses (fuses the small B x M score ops; B-NCE 3.3 vs 5.3 ms at
# V=100k) and does not help the dense softmax, whose time is the B x V matmuls.
# "snce_tf" (tf.nn.nce_loss with tf.random.fixed_unigram_candidate_sampler) is
# the stock TF S-NCE for reference; its sampler op has no XLA kernel.
# --end-to-end per pipeline: its config field of the output loss, the losses compared, the metrics kept.
END_TO_END = {
    "language_model": ("loss", ("softmax", "snce", "bnce"),
                       ("ppl_full", "ppl_self_normalized", "train_tokens_per_s", "parameters", "vocabulary")),
    "translation": ("output", ("softmax", "bnce"),
                    ("ppl_full", "greedy_bleu", "beam_bleu", "greedy_chrf", "beam_chrf", "train_tokens_per_s",
                     "parameters")),
    "image_captioning": ("output", ("softmax", "bnce"),
                         ("test/greedy_fact_accuracy", "test/beam_fact_accuracy", "test/greedy_bleu4",
                          "test/beam_bleu4", "test_novel/beam_fact_accuracy", "train_tokens_per_s", "parameters")),
}
#: --end-to-end: the decoders' headline BLEU, for issue 27's target
BEAM_BLEU = {"translation": "beam_bleu", "image_captioning": "test/beam_bleu4"}
AUTO_JIT = {"softmax": False, "snce": True, "snce_tf": False, "bnce": True, "adaptive_bnce": True}
LEARNING_RATE = 0.1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the benchmark's options to ``parser``.

    Args:
        parser: the (sub)command parser.
    """
    parser.add_argument("--vocab", default="10000,100000,800000", help="comma-separated vocabulary sizes")
    parser.add_argument("--hidden", type=int, default=200, help="hidden size H")
    parser.add_argument("--batch", type=int, default=400, help="targets per batch B")
    parser.add_argument("--repeats", type=int, default=30, help="timed steps per method (at most)")
    parser.add_argument("--noise", type=int, default=100, help="S-NCE samples and adaptive B-NCE extra noise K")
    parser.add_argument(
        "--budget", type=float, default=8.0, help="seconds of timed steps per method and vocab; caps the repeats"
    )
    parser.add_argument(
        "--jit", choices=("auto", "on", "off"), default="auto", help="XLA for the steps (auto: where faster)"
    )
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {METHODS}")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights, targets and noise")
    parser.add_argument("--end-to-end", action="store_true",
                        help="instead, train the --task pipeline with each loss on the same data")
    parser.add_argument("--task", choices=tuple(END_TO_END), default="language_model",
                        help="--end-to-end: the pipeline (any but language_model implies --end-to-end)")
    parser.add_argument("--steps", type=int, default=300, help="--end-to-end: training steps per loss")
    parser.add_argument("--train-minutes", type=float, default=None,
                        help="--end-to-end: instead of --steps, train each loss for this wall-clock budget "
                             "(the pipeline's epochs and early stopping still apply)")
    parser.add_argument("--preset", default="default", help="--end-to-end: the pipeline's preset")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="--end-to-end: another config override of every run (repeatable)")


def _peak_rss_mb() -> float:
    """The process's peak resident set size so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _zipf_unigram(vocab: int) -> np.ndarray:
    """A Zipf (exponent 1) unigram over ``vocab`` words, ids sorted by frequency."""
    weights = 1.0 / np.arange(1, vocab + 1, dtype="float64")
    return weights / weights.sum()


def _make_step(
    method: str,
    kernel: tf.Variable,
    bias: tf.Variable,
    noise_probs: tf.Variable,
    noise_cdf: tf.Variable,
    num_noise: int,
    jit: bool,
    unigrams: list[float],
) -> Callable[[tf.Tensor, tf.Tensor, tf.Tensor], tf.Tensor]:
    """A compiled training step ``step(hidden, targets, seed) -> loss`` for one method."""

    def loss_fn(hidden: tf.Tensor, targets: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        if method == "softmax":
            return softmax_loss(hidden, kernel, bias, targets)
        if method == "snce_tf":
            labels = tf.cast(targets[:, tf.newaxis], tf.int64)
            sampled = tf.random.fixed_unigram_candidate_sampler(
                labels, 1, num_noise, unique=False, range_max=len(unigrams), unigrams=unigrams
            )
            return tf.nn.nce_loss(
                kernel, bias, labels, hidden, num_noise, len(unigrams), sampled_values=sampled,
                remove_accidental_hits=True,
            )
        noise_ids = noise_ids_from_uniform(noise_cdf, tf.random.stateless_uniform([num_noise], seed=seed))
        if method == "snce":
            return sampled_nce_loss(hidden, kernel, bias, targets, noise_probs, noise_ids)
        extra = noise_ids if method == "adaptive_bnce" else None
        return batch_nce_loss(hidden, kernel, bias, targets, noise_probs, extra_noise_ids=extra)

    def step(hidden: tf.Tensor, targets: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            tape.watch(hidden)
            loss = tf.reduce_mean(loss_fn(hidden, targets, seed))
        d_hidden, d_kernel, d_bias = tape.gradient(loss, [hidden, kernel, bias])
        for variable, gradient in ((kernel, d_kernel), (bias, d_bias)):
            if isinstance(gradient, tf.IndexedSlices):
                variable.scatter_sub(tf.IndexedSlices(LEARNING_RATE * gradient.values, gradient.indices))
            else:
                variable.assign_sub(LEARNING_RATE * gradient)
        # d_hidden would flow into the network below; return a scalar of it so it is not pruned.
        return loss + 0.0 * tf.reduce_sum(d_hidden)

    return tf.function(step, jit_compile=jit)


def _bench_vocab(vocab: int, args: argparse.Namespace, methods: list[str], rng: np.random.RandomState) -> dict:
    """Times every method at one vocabulary size; returns medians, ratios and peak RSS."""
    probs = _zipf_unigram(vocab)
    kernel = tf.Variable(tf.random.normal([vocab, args.hidden], stddev=0.05, seed=args.seed), name="kernel")
    bias = tf.Variable(tf.fill([vocab], np.float32(-np.log(vocab))), name="bias")
    noise_probs = tf.Variable(probs.astype("float32"), trainable=False)
    noise_cdf = tf.Variable(np.cumsum(probs).astype("float32"), trainable=False)
    batches = [
        (
            tf.constant(rng.normal(size=(args.batch, args.hidden)).astype("float32")),
            tf.constant(rng.choice(vocab, size=args.batch, p=probs).astype("int32")),
        )
        for _ in range(4)
    ]
    rss = {"after_weights_mb": _peak_rss_mb()}
    jit = {m: AUTO_JIT[m] if args.jit == "auto" else args.jit == "on" and m != "snce_tf" for m in methods}
    unigrams = probs.tolist() if "snce_tf" in methods else []
    steps = {m: _make_step(m, kernel, bias, noise_probs, noise_cdf, args.noise, jit[m], unigrams) for m in methods}

    def timed(method: str, index: int) -> float:
        hidden, targets = batches[index % len(batches)]
        start = time.perf_counter()
        steps[method](hidden, targets, tf.constant([args.seed, index], "int32")).numpy()
        return time.perf_counter() - start

    # Warm up (trace and compile) the sampled methods before the softmax, so the
    # peak RSS before the softmax shows what the sampled losses need.
    repeats = {}
    for method in sorted(methods, key=lambda m: m == "softmax"):
        timed(method, 0)
        estimate = timed(method, 1)
        repeats[method] = int(max(3, min(args.repeats, args.budget // max(estimate, 1e-6))))
        if method == "softmax":
            rss["peak_after_softmax_mb"] = _peak_rss_mb()
        else:
            rss["peak_before_softmax_mb"] = _peak_rss_mb()

    times: dict[str, list[float]] = {m: [] for m in methods}
    for index in range(max(repeats.values())):
        for method in methods:
            if index < repeats[method]:
                times[method].append(timed(method, index))

    ms = {m: round(1e3 * statistics.median(times[m]), 3) for m in methods}
    ratios = {}
    if "bnce" in ms:
        for method in ("softmax", "snce", "snce_tf", "adaptive_bnce"):
            if method in ms:
                ratios[f"{method}/bnce"] = round(ms[method] / ms["bnce"], 2)
    return {
        "vocab": vocab,
        "median_ms": ms,
        "repeats": {m: len(times[m]) for m in methods},
        "jit": jit,
        "ratios": ratios,
        "peak_rss_mb": {k: round(v, 1) for k, v in rss.items()},
    }


def _targets_met(results: list[dict]) -> dict[str, bool]:
    """The project's speed targets that this run can check."""
    checks = {}
    for row in results:
        ratios = row["ratios"]
        for snce in ("snce", "snce_tf"):
            if f"{snce}/bnce" in ratios:
                checks[f"bnce_within_1.5x_of_{snce}@{row['vocab']}"] = ratios[f"{snce}/bnce"] >= 1 / 1.5
        needed = {100_000: 100, 800_000: 500}.get(row["vocab"])
        if needed and "softmax/bnce" in ratios:
            checks[f"softmax/bnce>={needed}@{row['vocab']}"] = ratios["softmax/bnce"] >= needed
    return checks


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Runs the benchmark.

    Args:
        args: the parsed options of ``add_arguments``.

    Returns:
        A JSON-able dict with the settings, one row per vocabulary size (median
        ms per method, softmax/bnce and snce/bnce ratios, peak RSS) and the
        targets this run met.
    """
    if args.end_to_end or args.task != "language_model":
        return _end_to_end(args)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise ConfigError(f"--methods: unknown {unknown}; choose from {METHODS}")
    vocabs = [int(v) for v in args.vocab.split(",") if v.strip()]
    rng = np.random.RandomState(args.seed)
    tf.random.set_seed(args.seed)
    results = [_bench_vocab(vocab, args, methods, rng) for vocab in vocabs]
    return {
        "settings": {
            "hidden": args.hidden,
            "batch": args.batch,
            "noise": args.noise,
            "max_repeats": args.repeats,
            "budget_s": args.budget,
            "jit": args.jit,
            "methods": methods,
            "threads": {
                "intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
                "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
            },
        },
        "results": results,
        "targets_met": _targets_met(results),
        "notes": (
            "median_ms: median wall time of one step (loss, gradients w.r.t. hidden and output weights, SGD update). "
            "peak_rss_mb: the process's peak resident set size (getrusage ru_maxrss), a high-water mark that "
            "never decreases: 'peak_before_softmax_mb' covers the weights plus the sampled methods, "
            "'peak_after_softmax_mb' adds the softmax's B x V logits and dense gradients."
        ),
    }


def _end_to_end(args: argparse.Namespace) -> dict[str, Any]:
    """Trains the ``--task`` pipeline with each output loss for the same steps (or minutes) on the same data.

    ``language_model`` compares softmax, S-NCE and B-NCE; ``translation`` softmax and B-NCE (its
    ``output``). Each run goes through the pipeline as ``seqapps run`` does (same corpus, vocabulary,
    model and seed); runs follow one another in this process. Training tokens/s is the pipeline's own
    measurement of timed training steps; PPL^f (and PPL^n, BLEU, chrF) are on the held-out test sample.

    Returns:
        One row per loss and the ratios bnce/softmax for tokens/s and PPL^f.
    """
    import tempfile

    from seqapps import runner

    field, losses, kept = END_TO_END[args.task]
    budget = ([f"max_train_minutes={args.train_minutes}"] if args.train_minutes is not None
              else ["epochs=1", f"steps_per_epoch={args.steps}"])
    rows = {}
    with tempfile.TemporaryDirectory() as out:
        for loss in losses:
            result = runner.run(args.task, args.preset, out=out,
                                overrides=[*args.overrides, f"{field}={loss}", *budget])
            metrics = result["metrics"]
            rows[loss] = {key: metrics[key] for key in kept}
            rows[loss]["train_s"] = result["training"]["seconds"]
            rows[loss]["wall_s"] = result["seconds"]
            rows[loss]["train_steps"] = result["training"]["steps"]
    softmax, bnce = rows["softmax"], rows["bnce"]
    ratios = {"tokens_per_s": round(bnce["train_tokens_per_s"] / softmax["train_tokens_per_s"], 2)}
    if "ppl_full" in bnce:
        ratios["ppl_full"] = round(bnce["ppl_full"] / softmax["ppl_full"], 3)
    if args.task in BEAM_BLEU:
        ratios["beam_bleu_difference"] = round(bnce[BEAM_BLEU[args.task]] - softmax[BEAM_BLEU[args.task]], 2)
    return {
        "settings": {"task": args.task, "preset": args.preset, "steps": args.steps,
                     "train_minutes": args.train_minutes, "overrides": args.overrides},
        "results": rows,
        "bnce_over_softmax": ratios,
        "targets_met": _end_to_end_targets_met(args.task, softmax, bnce),
    }


def _end_to_end_targets_met(task: str, softmax: dict[str, Any], bnce: dict[str, Any]) -> dict[str, bool]:
    """The issues' targets for B-NCE against the softmax: the language model's (issue 2: 5x the tokens/s at a
    PPL^f within 10%) or the decoders' (issue 27: 1.5x the tokens/s at a beam BLEU within 1)."""
    speed = bnce["train_tokens_per_s"] / softmax["train_tokens_per_s"]
    if task in BEAM_BLEU:
        bleu = BEAM_BLEU[task]
        return {"bnce_tokens_per_s_at_least_1.5x_softmax": speed >= 1.5,
                "bnce_beam_bleu_within_1_of_softmax": bnce[bleu] >= softmax[bleu] - 1}
    return {"bnce_tokens_per_s_at_least_5x_softmax": speed >= 5,
            "bnce_ppl_full_within_10pct_of_softmax": bnce["ppl_full"] <= 1.1 * softmax["ppl_full"]}
