"""What the pipelines' report tests check alike: their sections by anchor, and figures that decode."""
from __future__ import annotations

import io
from typing import Any, Iterable

import numpy as np
from PIL import Image

from seqapps.pipeline import Pipeline
from seqapps.report.document import Section, figures_of


def sections_by_anchor(pipeline: Pipeline, result: dict[str, Any], arrays: dict[str, Any]) -> dict[str, Section]:
    """The pipeline's own report sections, in order, by their HTML id."""
    return {section.id(): section for section in pipeline.report_sections(result, arrays)}


def assert_figures_decode(sections: Iterable[Section]) -> None:
    """Every figure of ``sections`` is a PNG that PIL decodes, over 100 pixels each way."""
    for figure in figures_of(list(sections)):
        with Image.open(io.BytesIO(figure.png)) as image:
            image.load()
            assert image.format == "PNG" and min(image.size) > 100, (figure.name, image.size)


def assert_attention_sums_to_one(attention: np.ndarray, queries: np.ndarray, keys: np.ndarray | None = None) -> None:
    """Each real query's weights over the real keys sum to 1 (a softmax); padding rows and columns weigh 0.

    Args:
        attention: ``[batch, queries, keys]`` weights.
        queries: bool ``[batch, queries]``, the real output words.
        keys: bool ``[batch, keys]``, the real inputs attended to (None: all of them).
    """
    keys = np.ones((attention.shape[0], attention.shape[2]), bool) if keys is None else keys
    np.testing.assert_allclose(attention.sum(-1)[queries], 1.0, atol=1e-5)  # float32 sums of a few dozen terms
    assert np.all(attention[~(queries[:, :, None] & keys[:, None, :])] == 0)
