"""Sentence translation with an RNN encoder-decoder and attention (Bahdanau et al. 2015; Luong et al. 2015).

Data: English to Spanish verse pairs of the World English Bible (apt ``sword-text-web``) and the
Reina-Valera 1909 (apt ``sword-text-sparv``), both public domain, joined on the verse key and split
by chapter (``seqapps.data.pairs``). The ``tiny`` preset uses number phrases from pip ``num2words``.
``--data pairs.tsv`` reads the user's ``source<TAB>target`` lines (or a ``.csv``).

Baseline: word-by-word lexical translation with IBM Model 1 (``LexicalTranslator``).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

NULL = "<null>"  # the empty source word of IBM Model 1, which absorbs target words with no source word


@dataclasses.dataclass
class LexicalTranslator:
    """Word-by-word translation: each source word becomes its likeliest target word under IBM Model 1.

    IBM Model 1 (Brown et al. 1993) estimates ``t(target word | source word)`` by EM over the training
    pairs, every target word aligned to one source word or to ``NULL``. ``translate`` writes, for each
    source word, the target word of highest ``t``; unseen source words are copied (names, numbers).

    Attributes:
        table: source word -> its likeliest target word.
    """

    table: dict[str, str]

    @classmethod
    def fit(cls, sources: Sequence[Sequence[str]], targets: Sequence[Sequence[str]],
            iterations: int = 5) -> "LexicalTranslator":
        """Runs EM for IBM Model 1 from uniform translation probabilities.

        Args:
            sources, targets: the training pairs as token lists.
            iterations: EM iterations (5 is the usual number; the likelihood rises monotonically).

        Returns:
            The translator.
        """
        source_words = sorted({word for sentence in sources for word in sentence} | {NULL})
        target_words = sorted({word for sentence in targets for word in sentence})
        source_index = {word: i for i, word in enumerate(source_words)}
        target_index = {word: i for i, word in enumerate(target_words)}
        # Every (source position, target position) link of every pair, as flat arrays: a target
        # position's links share one ``position`` id, over which its alignment posterior is normalised.
        link_source, link_target, link_position, offset = [], [], [], 0
        for source, target in zip(sources, targets):
            if not target:
                continue
            s = np.array([source_index[NULL]] + [source_index[w] for w in source], "int64")
            t = np.array([target_index[w] for w in target], "int64")
            link_source.append(np.tile(s, len(t)))
            link_target.append(np.repeat(t, len(s)))
            link_position.append(np.repeat(np.arange(offset, offset + len(t)), len(s)))
            offset += len(t)
        link_source, link_target = np.concatenate(link_source), np.concatenate(link_target)
        link_position = np.concatenate(link_position)
        pair_ids, link_pair = np.unique(link_source * len(target_words) + link_target, return_inverse=True)
        pair_source, pair_target = pair_ids // len(target_words), pair_ids % len(target_words)
        probs = np.full(len(pair_ids), 1.0 / len(target_words))
        for _ in range(iterations):
            link_probs = probs[link_pair]
            posterior = link_probs / np.bincount(link_position, link_probs)[link_position]
            expected = np.bincount(link_pair, posterior, minlength=len(pair_ids))
            probs = expected / np.bincount(pair_source, expected, minlength=len(source_words))[pair_source]
        best = np.full(len(source_words), -1.0)
        choice = np.zeros(len(source_words), "int64")
        order = np.lexsort((-probs, pair_source))  # by source word, likeliest target first
        first = order[np.r_[True, pair_source[order][1:] != pair_source[order][:-1]]]
        best[pair_source[first]], choice[pair_source[first]] = probs[first], pair_target[first]
        return cls({word: target_words[choice[i]] for i, word in enumerate(source_words)
                    if word != NULL and best[i] >= 0})

    def translate(self, tokens: Sequence[str]) -> list[str]:
        """Translates a token list word by word (unseen words are copied).

        Args:
            tokens: the source tokens.

        Returns:
            One target token per source token.
        """
        return [self.table.get(token, token) for token in tokens]
