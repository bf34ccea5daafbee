"""The report's figures, drawn with matplotlib's Agg backend (offline, no display) into PNGs.

Each function returns a ``seqapps.report.document.Figure``. A pipeline that needs a picture
none of these draws composes it on ``canvas()`` and closes it with ``to_figure``, so that every
figure is encoded the same way (size, resolution) and no matplotlib figure is left open.
"""
from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from seqapps.report.document import Figure

if TYPE_CHECKING:
    import matplotlib.axes
    import matplotlib.figure

#: dots per inch of every PNG: sharp on a screen, small in the file
DPI = 90
#: the width of a figure in inches; height follows the content
WIDTH = 8.0


def canvas(rows: int = 1, columns: int = 1, height: float = 3.2,
           **subplot_args: Any) -> "tuple[matplotlib.figure.Figure, Any]":
    """A new figure and its axes (``plt.subplots``), sized for the report.

    Args:
        rows, columns: the grid of axes.
        height: the height of one row, in inches.
        subplot_args: more ``plt.subplots`` arguments (``sharex``, ``gridspec_kw``, ``squeeze``).

    Returns:
        ``(figure, axes)``; pass the figure to ``to_figure`` when done.
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib import pyplot

    return pyplot.subplots(rows, columns, figsize=(WIDTH, height * rows), **subplot_args)


def to_figure(name: str, figure: "matplotlib.figure.Figure", caption: str = "") -> Figure:
    """Encodes a matplotlib figure as the report's PNG and closes it.

    Args:
        name: the figure's identifier (unique in the report; the TensorBoard tag).
        figure: from ``canvas``.
        caption: what it shows.
    """
    from matplotlib import pyplot

    buffer = io.BytesIO()
    try:
        figure.tight_layout()
        figure.savefig(buffer, format="png", dpi=DPI)
    finally:
        pyplot.close(figure)
    return Figure(name, buffer.getvalue(), caption)


def line_chart(name: str, title: str, series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
               xlabel: str, ylabel: str, caption: str = "",
               bands: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float]]] | None = None,
               log_y: bool = False, markers: bool = False) -> Figure:
    """Lines of ``(x, y)``, with optional shaded bands (an interval ``(x, low, high)``).

    Args:
        name, caption: as for ``Figure``.
        title: the axes' title.
        series: label -> ``(x, y)``.
        xlabel, ylabel: the axis labels.
        bands: label -> ``(x, low, high)``, drawn under the lines.
        log_y: a logarithmic y axis.
        markers: mark each point (for short series, such as a few epochs).

    Where every x is an integer (epochs, lead times), the x ticks are whole numbers (never 0.98).
    """
    figure, axes = canvas()
    for label, (x, low, high) in (bands or {}).items():
        axes.fill_between(np.asarray(x), np.asarray(low, float), np.asarray(high, float), alpha=0.25, label=label)
    for label, (x, y) in series.items():
        axes.plot(np.asarray(x), np.asarray(y, float), marker="o" if markers else None, markersize=3, label=label)
    axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if log_y:
        axes.set_yscale("log")
    if all(np.asarray(x).dtype.kind in "iu" for x, *_ in [*series.values(), *(bands or {}).values()]):
        from matplotlib.ticker import MaxNLocator

        axes.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    if len(series) + len(bands or {}) > 1:
        axes.legend(fontsize="small")
    axes.grid(alpha=0.3)
    return to_figure(name, figure, caption)


def heatmap(name: str, title: str, matrix: np.ndarray, x_labels: Sequence[str] | None = None,
            y_labels: Sequence[str] | None = None, xlabel: str = "", ylabel: str = "", caption: str = "",
            colorbar: str = "", axes: "matplotlib.axes.Axes | None" = None) -> Figure | None:
    """A matrix as a picture, row 0 at the top (attention, a taggram, a spectrogram).

    Args:
        name, caption: as for ``Figure``.
        title: the axes' title.
        matrix: ``[rows, columns]``.
        x_labels, y_labels: a label per column / row (for example words or tag names); only a
            few dozen are shown, evenly spaced, when there are more.
        xlabel, ylabel: the axis labels.
        colorbar: the colour bar's label ("" for none).
        axes: draw into these axes of a ``canvas`` instead, and return None (the caller
            finishes the figure with ``to_figure``).
    """
    own = axes is None
    if own:
        rows = matrix.shape[0]
        figure, axes = canvas(height=float(np.clip(0.22 * rows + 1.5, 2.5, 7.0)))
    image = axes.imshow(np.asarray(matrix, float), aspect="auto", interpolation="nearest", origin="upper")
    for labels, setter, count in ((x_labels, "x", matrix.shape[1]), (y_labels, "y", matrix.shape[0])):
        if labels is not None:
            ticks = np.unique(np.linspace(0, count - 1, min(count, 40)).round().astype(int))
            getattr(axes, f"set_{setter}ticks")(ticks, [str(labels[t]) for t in ticks],
                                                 rotation=90 if setter == "x" else 0, fontsize="x-small")
    axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if colorbar:
        axes.figure.colorbar(image, ax=axes, label=colorbar)
    return to_figure(name, figure, caption) if own else None


def bar_chart(name: str, title: str, values: Mapping[str, Mapping[str, float]], ylabel: str,
              caption: str = "") -> Figure:
    """Grouped bars: a group per category, a bar per series (a model against its baselines).

    Args:
        name, caption: as for ``Figure``.
        title: the axes' title.
        values: series label -> {category: value}; the categories of the first series, in order.
        ylabel: the value axis label.
    """
    categories = list(next(iter(values.values()), {}))
    figure, axes = canvas(height=3.6)
    width = 0.8 / max(len(values), 1)
    positions = np.arange(len(categories))
    for index, (label, by_category) in enumerate(values.items()):
        heights = [float(by_category.get(c, np.nan)) for c in categories]
        axes.bar(positions + index * width - 0.4 + width / 2, heights, width, label=label)
    axes.set_xticks(positions, categories, rotation=60 if len(categories) > 6 else 0, ha="right"
                    if len(categories) > 6 else "center", fontsize="small")
    axes.set(title=title, ylabel=ylabel)
    if len(values) > 1:
        axes.legend(fontsize="small")
    axes.grid(axis="y", alpha=0.3)
    return to_figure(name, figure, caption)


def image_grid(name: str, images: Sequence[np.ndarray], titles: Sequence[str], caption: str = "",
               overlays: Sequence[np.ndarray | None] | None = None, columns: int = 4) -> Figure:
    """Pictures in a grid, each with a title under it and an optional heat overlay (attention).

    Args:
        name, caption: as for ``Figure``.
        images: ``[height, width, 3]`` uint8 (or float in [0, 1]) pictures.
        titles: one per picture (wrapped).
        overlays: per picture, None or a small ``[rows, columns]`` map stretched over it.
        columns: pictures per row.
    """
    import textwrap

    rows = max(1, -(-len(images) // columns))
    figure, axes = canvas(rows, columns, height=2.6, squeeze=False)
    for index, cell in enumerate(axes.flat):
        cell.axis("off")
        if index >= len(images):
            continue
        image = np.asarray(images[index])
        cell.imshow(image)
        overlay = overlays[index] if overlays is not None else None
        if overlay is not None:
            cell.imshow(np.asarray(overlay, float), cmap="inferno", alpha=0.45, interpolation="bilinear",
                        extent=(-0.5, image.shape[1] - 0.5, image.shape[0] - 0.5, -0.5))
        cell.set_title("\n".join(textwrap.wrap(titles[index], 28)), fontsize="x-small")
    return to_figure(name, figure, caption)
