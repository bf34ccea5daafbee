"""Tests of the translation pipeline: its lexical baseline, a tiny end-to-end run and bad input."""
import collections
import random

from pipelines.translation import NULL, LexicalTranslator


def _ibm1_reference(sources, targets, iterations):
    """IBM Model 1 EM written as the textbook's nested loops (Koehn 2010, fig. 4.3), with a NULL word."""
    target_vocab = {word for sentence in targets for word in sentence}
    t = collections.defaultdict(lambda: 1.0 / len(target_vocab))
    for _ in range(iterations):
        count, total = collections.defaultdict(float), collections.defaultdict(float)
        for source, target in zip(sources, targets):
            source = [NULL, *source]
            for f in target:
                norm = sum(t[(f, e)] for e in source)
                for e in source:
                    count[(f, e)] += t[(f, e)] / norm
                    total[e] += t[(f, e)] / norm
        t = collections.defaultdict(float, {(f, e): c / total[e] for (f, e), c in count.items()})
    best = {}
    for (f, e), p in sorted(t.items()):
        if e != NULL and p > best.get(e, ("", -1.0))[1]:
            best[e] = (f, p)
    return {e: f for e, (f, _) in best.items()}


def test_ibm1_learns_the_textbook_example():
    # Koehn (2010) section 4.2: "das Haus", "das Buch", "ein Buch"; EM links each word to its translation.
    translator = LexicalTranslator.fit([["the", "house"], ["the", "book"], ["a", "book"]],
                                       [["das", "haus"], ["das", "buch"], ["ein", "buch"]], iterations=10)
    assert translator.table == {"the": "das", "house": "haus", "book": "buch", "a": "ein"}
    assert translator.translate(["a", "house", "moses"]) == ["ein", "haus", "moses"]  # unseen words are copied


def test_ibm1_matches_the_nested_loop_reference_on_random_pairs():
    rng = random.Random(0)
    sources = [[f"s{rng.randrange(12)}" for _ in range(rng.randint(1, 6))] for _ in range(60)]
    targets = [[f"t{rng.randrange(15)}" for _ in range(rng.randint(1, 6))] for _ in range(60)]
    assert LexicalTranslator.fit(sources, targets, iterations=4).table == _ibm1_reference(sources, targets, 4)
