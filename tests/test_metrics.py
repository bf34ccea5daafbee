import numpy as np
import pytest

from seqapps.metrics import (
    CHUNK,
    bits_per_char,
    bleu,
    character_error_rate,
    chrf,
    f1_thresholds,
    forecast_metrics,
    group_means,
    label_log_probs,
    mae_by_lead,
    mase_scale,
    perplexity,
    pr_auc,
    precision_recall_at,
    roc_auc,
    seasonal_naive,
    tagging_report,
    unigram_log_probs,
    word_error_rate,
)


def test_seasonal_naive_repeats_the_last_whole_season():
    series = np.arange(20.0)
    # Origin 9, period 4, horizon 6: steps 1..4 repeat indices 6..9, steps 5..6 repeat 6..7.
    np.testing.assert_array_equal(seasonal_naive(series, np.array([9]), 6, 4), [[6, 7, 8, 9, 6, 7]])
    with pytest.raises(ValueError, match="more steps of history"):
        seasonal_naive(series, np.array([2]), 2, 4)


def test_seasonal_naive_gathered_in_chunks_equals_one_gather(monkeypatch):
    import seqapps.metrics

    series = np.random.default_rng(3).normal(size=(200, 2))
    origins = np.arange(30, 180, 7)
    steps = np.arange(1, 11)
    expected = series[origins[:, None] + steps - 8 * np.ceil(steps / 8).astype(int)]  # the whole index at once
    monkeypatch.setattr(seqapps.metrics, "CHUNK", 25)  # chunks of 2 rows of 10 steps, the last one shorter
    np.testing.assert_array_equal(seasonal_naive(series, origins, 10, 8), expected)


def test_forecast_metrics_against_hand_computed_values():
    truth = np.array([[1.0, 2.0], [3.0, 4.0]])
    forecast = np.array([[2.0, 2.0], [1.0, 4.0]])
    result = forecast_metrics(truth, forecast, scale=2.0)
    assert result["mae"] == pytest.approx(0.75)
    assert result["rmse"] == pytest.approx(np.sqrt(5 / 4))
    assert result["smape"] == pytest.approx(100 * np.mean([2 / 3, 0, 1, 0]))
    assert result["mase"] == pytest.approx(0.375)
    assert mase_scale(np.array([1.0, 3.0, 2.0, 6.0]), 1) == pytest.approx(np.mean([2, 1, 4]))


def test_forecast_metrics_of_a_series_longer_than_a_chunk_match_numpy():
    rng = np.random.default_rng(0)
    truth = rng.normal(size=(2 * CHUNK + 5, 2)).astype("float32")  # 5 chunks, the last short
    forecast = truth + rng.normal(size=truth.shape).astype("float32")
    truth[:3] = forecast[:3] = 0.0  # sMAPE counts 0 where both are 0
    error = np.abs(truth.astype("float64") - forecast)
    denominator = np.abs(truth.astype("float64")) + np.abs(forecast)
    result = forecast_metrics(truth, forecast, scale=0.5)
    # Chunk sums against NumPy's pairwise mean over 4M float64 values: round-off of ~1e-15 relative.
    assert result["mae"] == pytest.approx(error.mean(), rel=1e-12)
    assert result["rmse"] == pytest.approx(np.sqrt(np.mean(error ** 2)), rel=1e-12)
    ratio = np.divide(error, denominator, out=np.zeros_like(error), where=denominator > 0)
    assert result["smape"] == pytest.approx(200 * ratio.mean(), rel=1e-12)


def test_mae_by_lead_of_more_rows_than_a_chunk_is_numpys_per_column_mean_and_averages_to_the_mae():
    rng = np.random.default_rng(1)
    horizon = 24
    truth = rng.normal(size=(2 * (CHUNK // horizon) + 7, horizon)).astype("float32")  # 3 chunks of rows, the last short
    forecast = truth + rng.normal(scale=np.arange(1, horizon + 1) / horizon, size=truth.shape).astype("float32")
    found = mae_by_lead(truth, forecast)
    # Chunk sums against NumPy's pairwise mean over ~87k float64 values per step: round-off of ~1e-15 relative.
    np.testing.assert_allclose(found, np.abs(truth.astype("float64") - forecast).mean(axis=0), rtol=1e-12)
    assert found.mean() == pytest.approx(forecast_metrics(truth, forecast, scale=1.0)["mae"], rel=1e-12)
    assert found[-1] > 5 * found[0]  # the error grows with the lead, as drawn


# --- Translation -----------------------------------------------------------------------------------------------------
# sacrebleu's README example (github.com/mjpost/sacrebleu, "Using SacreBLEU from Python"): two reference streams,
# documented results BLEU = 48.53 and chrF2 = 59.73. Here the references are given per hypothesis.
README_HYPOTHESES = ["The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."]
README_REFERENCES = [["The dog bit the man.", "The dog had bit the man."],
                     ["It was not unexpected.", "No one was surprised."],
                     ["The man bit him first.", "The man had bitten the dog."]]


def test_bleu_matches_a_hand_computed_score_and_sacrebleus_documented_example():
    # Hand count for one sentence pair (no punctuation, so tokenisation does not matter): clipped n-gram precisions
    # 5/6, 3/5, 2/4, 1/3 and equal lengths (brevity penalty 1): BLEU = (5/6 * 3/5 * 2/4 * 1/3) ** (1/4) = 12 ** -0.25.
    result = bleu(["the cat sat on a mat"], ["the cat sat on the mat"])
    assert result["score"] == pytest.approx(100 * 12 ** -0.25, abs=1e-9)
    assert result["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    documented = bleu(README_REFERENCES, README_HYPOTHESES)
    assert round(documented["score"], 2) == 48.53 and documented["signature"].startswith("nrefs:2|")


def test_bleu_of_tokenised_hypotheses_equals_the_detokenised_score_without_sacrebleus_warning(capsys, caplog):
    # sacrebleu warns once 100 hypotheses end in " ." (a user's translation run printed four lines of it); 13a
    # splits the references' punctuation, so the tokenised and the detokenised hypotheses score the same.
    references = ["El que venga, dijo: ven."] * 120
    tokenised = bleu(references, ["el que venga , dijo : ven ."] * 120)
    detokenised = bleu(references, ["el que venga, dijo: ven."] * 120)
    assert tokenised == detokenised and 0 < tokenised["score"] < 100
    assert capsys.readouterr().err == "" and not caplog.records


def test_chrf_matches_sacrebleus_documented_example_and_its_bounds():
    assert round(chrf(README_REFERENCES, README_HYPOTHESES)["score"], 2) == 59.73
    assert chrf(["same words"], ["same words"])["score"] == pytest.approx(100)
    assert chrf(["abc"], ["xyz"])["score"] == 0


def test_references_may_vary_in_number_per_hypothesis():
    # A missing second reference is the same as giving only the first one for that sentence.
    one = bleu([["a b c d e", "a b x d e"], "f g h i j"], ["a b x d e", "f g h i k"])
    padded = bleu([["a b c d e", "a b x d e"], ["f g h i j", "f g h i j"]], ["a b x d e", "f g h i k"])
    assert one["score"] == pytest.approx(padded["score"])
    with pytest.raises(ValueError, match="2 references for 1 hypotheses"):
        bleu(["a", "b"], ["a"])


# --- Speech recognition -------------------------------------------------------------------------------------------


def test_word_and_character_error_rates_against_hand_counts():
    # "the cat sat on the mat" -> "the cat sit on mat": one substitution (sat/sit), one deletion (the): 2 / 6 words.
    assert word_error_rate(["the cat sat on the mat"], ["the cat sit on mat"]) == pytest.approx(2 / 6)
    # Corpus level pools the counts: (1 substitution + 1 deletion) / (3 + 2) words, not the mean of 1/3 and 1/2.
    assert word_error_rate(["a b c", "d e"], ["a x c", "d"]) == pytest.approx(2 / 5)
    # kitten -> sitting: k/s and e/i substituted, g inserted: 3 edits / 6 characters.
    assert character_error_rate(["kitten"], ["sitting"]) == pytest.approx(3 / 6)
    with pytest.raises(ValueError, match="reference 1 is empty"):
        word_error_rate(["a", " "], ["a", "b"])


# --- Tagging -----------------------------------------------------------------------------------------------------------


def test_roc_and_pr_auc_against_hand_computed_values_with_a_single_class_label_skipped():
    truth = np.array([[0, 1, 0], [0, 0, 0], [1, 1, 0], [1, 0, 0]])
    scores = np.array([[0.1, 0.9, 0.2], [0.4, 0.3, 0.1], [0.35, 0.2, 0.3], [0.8, 0.6, 0.4]])
    roc = roc_auc(truth, scores, labels=["rock", "jazz", "none"])
    pr = pr_auc(truth, scores, labels=["rock", "jazz", "none"])
    # rock: positives 0.35, 0.8 vs negatives 0.1, 0.4; 3 of the 4 pairs are ordered right -> 0.75.
    # jazz: positives 0.9, 0.2 vs negatives 0.3, 0.6; 2 of 4 pairs right -> 0.5.
    assert roc["per_label"] == pytest.approx({"rock": 0.75, "jazz": 0.5})
    assert roc["macro"] == pytest.approx(0.625)
    # rock ranked 0.8(+) 0.4(-) 0.35(+) 0.1(-): precision 1 at recall 1/2, 2/3 at recall 1 -> AP = 1/2 + 1/3 = 5/6.
    # jazz ranked 0.9(+) 0.6(-) 0.3(-) 0.2(+): precision 1 at recall 1/2, 2/4 at recall 1 -> AP = 1/2 + 1/4 = 3/4.
    assert pr["per_label"] == pytest.approx({"rock": 5 / 6, "jazz": 3 / 4})
    assert pr["macro"] == pytest.approx((5 / 6 + 3 / 4) / 2)
    assert roc["skipped"] == pr["skipped"] == {"none": "only negative examples (4)"}
    # Micro pools all 12 decisions: positives 0.9, 0.8, 0.35, 0.2 against the negatives 0.1, 0.4, 0.3, 0.6 (rock,
    # jazz) and 0.2, 0.1, 0.3, 0.4 (the skipped label). Pairs ordered right: 8 + 8 + 5 + 2, plus a tie (0.2 = 0.2)
    # counting one half: AUC = 23.5 / 32.
    assert roc["micro"] == pytest.approx(23.5 / 32)


def test_auc_with_no_scorable_label_reports_reasons_not_nan():
    result = roc_auc(np.ones((3, 1)), np.array([[0.1], [0.5], [0.9]]))
    assert result == {"macro": None, "micro": None, "per_label": {}, "skipped": {"0": "only positive examples (3)"}}
    with pytest.raises(ValueError, match="same shape"):
        roc_auc(np.zeros((3, 2)), np.zeros((3, 1)))


# --- Language modelling ------------------------------------------------------------------------------------------------


def test_perplexity_and_bits_per_char_of_known_distributions():
    # A uniform choice among 4 symbols: perplexity 4 and 2 bits per symbol; the padding (mask 0) is ignored.
    log_probs = np.log(np.array([[0.25, 0.25, 0.25, 1e-9]]))
    mask = np.array([[1, 1, 1, 0]])
    assert perplexity(log_probs, mask) == pytest.approx(4)
    assert bits_per_char(log_probs, mask) == pytest.approx(2)
    # Probabilities 1/2 and 1/8: mean cost (1 + 3) / 2 = 2 bits, perplexity 2 ** 2.
    assert bits_per_char(np.log([0.5, 0.125])) == pytest.approx(2)
    assert perplexity(np.log([0.5, 0.125])) == pytest.approx(4)
    with pytest.raises(ValueError, match="no tokens"):
        perplexity(np.zeros(2), np.zeros(2))


def test_label_log_probs_are_the_softmax_of_the_labels_scores():
    # Scores [0, log 3] give probabilities [1/4, 3/4]; shifted by 1000 (exp would overflow) they give the same.
    logits = np.array([[[0.0, np.log(3.0)], [1000.0, 1000.0 + np.log(3.0)]]])
    found = label_log_probs(logits, np.array([[0, 1]]))
    assert found.shape == (1, 2) and found.dtype == np.float64
    np.testing.assert_allclose(found, np.log([[0.25, 0.75]]), rtol=1e-6)


def test_unigram_log_probs_is_the_add_one_unigram_model():
    # Counts [1, 3, 0] + 1 = [2, 4, 1], over 7.
    np.testing.assert_allclose(unigram_log_probs([1, 3, 0], [1, 2, 0]), np.log([4 / 7, 1 / 7, 2 / 7]))
    # A uniform unigram over 8 tokens costs exactly 3 bits per character.
    assert bits_per_char(unigram_log_probs(np.zeros(8), np.arange(8))) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="smoothing > 0"):
        unigram_log_probs([0, 2], [0], smoothing=0.0)  # id 0 would have probability 0


def test_f1_thresholds_on_a_worked_case():
    truth = np.array([[1, 0], [1, 0], [0, 0], [0, 0]])
    scores = np.array([[0.9, 0.1], [0.6, 0.2], [0.55, 0.3], [0.1, 0.4]])
    # tag 0: threshold 0.6 keeps both positives and no negative (F1 = 1); tag 1 has no positive: 0.5
    np.testing.assert_allclose(f1_thresholds(truth, scores), [0.6, 0.5])


def _decision_counts(truth: np.ndarray, decided: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """True positives, decided positives and true positives of each column, counted in NumPy."""
    return (truth * decided).sum(axis=0), decided.sum(axis=0), truth.sum(axis=0)


def test_f1_thresholds_reach_the_best_f1_of_every_candidate_threshold():
    rng = np.random.default_rng(0)
    truth = (rng.random((40, 5)) < 0.3).astype(int)
    # float32, as a model's scores (and the thresholds) are; rounded, so that tied scores happen
    scores = np.round(rng.random((40, 5)) * 0.6 + 0.4 * truth, 2).astype(np.float32)
    thresholds = f1_thresholds(truth, scores)
    for tag in range(truth.shape[1]):
        column, positives = scores[:, tag], truth[:, tag]

        def f1(cut: float) -> float:
            hits, decided, wanted = _decision_counts(positives[:, None], (column >= cut)[:, None].astype(int))
            return float(2 * hits[0] / (decided[0] + wanted[0]))

        # brute force over every distinct score: the chosen cut is a score, and none gives a higher F1
        best = max(f1(cut) for cut in np.unique(column))
        assert thresholds[tag] in column
        assert f1(thresholds[tag]) == pytest.approx(best, abs=1e-12)


def test_precision_and_recall_at_thresholds_match_numpy_counts():
    rng = np.random.default_rng(1)
    truth = (rng.random((30, 4)) < 0.4).astype(int)
    truth[:, 3] = 0  # a tag without positives: its recall (and precision, if decided) counts as 0
    scores = rng.random((30, 4))
    thresholds = np.array([0.3, 0.5, 0.7, 0.9], np.float32)
    hits, decided, wanted = _decision_counts(truth, (scores >= thresholds).astype(int))
    precision = np.divide(hits, decided, out=np.zeros(4), where=decided > 0)
    recall = np.divide(hits, wanted, out=np.zeros(4), where=wanted > 0)
    assert precision_recall_at(truth, scores, thresholds) == pytest.approx({
        "precision_micro": hits.sum() / decided.sum(), "recall_micro": hits.sum() / wanted.sum(),
        "precision_macro": precision.mean(), "recall_macro": recall.mean()}, abs=1e-12)


def test_group_means_average_the_tags_of_each_group_and_skip_plain_tags():
    per_tag = {"genre:reel": 0.9, "genre:jig": 0.7, "mode:major": 0.6, "loud": 0.1}
    assert group_means(per_tag) == pytest.approx({"genre": 0.8, "mode": 0.6})
    assert group_means({"loud": 0.1}) == {}


def test_tagging_report_holds_the_label_averages_and_each_groups_mean_roc_auc():
    from sklearn.metrics import average_precision_score, roc_auc_score

    rng = np.random.default_rng(2)
    tags = ["genre:reel", "genre:jig", "mode:major", "loud"]
    truth = (rng.random((25, 4)) < 0.5).astype(int)
    truth[:, 2] = 1  # one class only: skipped, as roc_auc skips it
    scores = rng.random((25, 4))
    report = tagging_report(truth, scores, tags)
    scored = [0, 1, 3]
    per_tag = {tags[i]: roc_auc_score(truth[:, i], scores[:, i]) for i in scored}
    assert report["roc_auc_per_tag"] == pytest.approx(per_tag)
    assert report["roc_auc_macro"] == pytest.approx(np.mean(list(per_tag.values())))
    assert report["roc_auc_micro"] == pytest.approx(roc_auc_score(truth.ravel(), scores.ravel()))
    assert report["pr_auc_macro"] == pytest.approx(np.mean([average_precision_score(truth[:, i], scores[:, i])
                                                            for i in scored]))
    assert report["pr_auc_micro"] == pytest.approx(average_precision_score(truth.ravel(), scores.ravel()))
    assert report["roc_auc_per_group"] == pytest.approx({"genre": (per_tag["genre:reel"] + per_tag["genre:jig"]) / 2})
    assert list(report["skipped_tags"]) == ["mode:major"]
