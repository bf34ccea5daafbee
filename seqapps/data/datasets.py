"""Embedded default datasets, read offline from installed packages, and tensorflow-datasets readers.

Each reader returns a table whose ``attrs["source"]`` names where it came from,
so validation errors point at it as they would at a user's CSV.

``--data tfds:NAME[:SPLIT]`` reads a data set that is already in the local
tensorflow-datasets folder (``TFDS_DATA_DIR``, default ``~/tensorflow_datasets``);
nothing is ever downloaded. A missing one is one error line naming the
``tfds build NAME`` command to run on a machine with a network.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pandas as pd

from seqapps.errors import DataError

if TYPE_CHECKING:
    import tensorflow as tf

    from seqapps.data.pairs import Pairs
    from seqapps.data.text import Corpus

TFDS_PREFIX = "tfds:"

WEATHER_COLUMNS = ["temp_air", "temp_dew", "relative_humidity", "pressure", "wind_speed"]


def tmy3_weather(station_file: str = "723170TYA.CSV") -> pd.DataFrame:
    """Hourly typical-year weather shipped with pvlib (BSD-3), 8,760 rows.

    The file is read with ``pvlib.iotools.read_tmy3``; the typical year joins months
    from different years, so it is stamped as one calendar year (1990) in local
    standard time.

    Args:
        station_file: a TMY3 file name inside ``pvlib/data``.

    Returns:
        Columns ``timestamp`` and ``WEATHER_COLUMNS`` (deg C, deg C, %, mbar, m/s).
    """
    import pvlib

    path = Path(pvlib.__file__).parent / "data" / station_file
    data, _ = pvlib.iotools.read_tmy3(str(path), map_variables=True, coerce_year=1990)
    frame = data[WEATHER_COLUMNS].reset_index(drop=True)
    frame.insert(0, "timestamp", data.index.tz_localize(None))
    frame.attrs["source"] = f"pvlib/data/{station_file}"
    return frame


def taylor_load() -> pd.DataFrame:
    """Half-hourly electricity demand (MW) in England and Wales from 5 June 2000, 12 weeks.

    From ``pmdarima.datasets.load_taylor`` (MIT), which returns the bare series;
    the timestamps are those of Taylor (2003).

    Returns:
        Columns ``timestamp`` and ``demand``; 4,032 rows.
    """
    from pmdarima.datasets import load_taylor

    demand = load_taylor()
    frame = pd.DataFrame({"timestamp": pd.date_range("2000-06-05", periods=len(demand), freq="30min"),
                          "demand": demand.astype("float64")})
    frame.attrs["source"] = "pmdarima load_taylor"
    return frame


def is_tfds(data_path: str | None) -> bool:
    """True for ``--data tfds:NAME[:SPLIT]``."""
    return bool(data_path) and data_path.startswith(TFDS_PREFIX)


def tfds_dataset(data_path: str, split: str = "train", as_supervised: bool = False) -> "tf.data.Dataset":
    """Reads one split of a tensorflow-datasets data set from the local tfds folder, never downloading.

    Args:
        data_path: ``tfds:NAME`` or ``tfds:NAME:SPLIT`` (the SPLIT given there wins over ``split``;
            tfds slicing such as ``train[:10%]`` works).
        split: the split to read when ``data_path`` names none.
        as_supervised: yield ``(input, label)`` pairs instead of feature dicts.

    Returns:
        The split's examples, unbatched.

    Raises:
        DataError: tensorflow-datasets is not installed, the name is unknown, or the
            data is not in the local folder.
    """
    name, _, given = data_path[len(TFDS_PREFIX):].partition(":")
    if not name:
        raise DataError(f"--data {data_path}: expected tfds:NAME or tfds:NAME:SPLIT (e.g. tfds:mnist:train)")
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise DataError(f"--data {data_path} needs tensorflow-datasets: pip install tensorflow-datasets") from None
    if name.split("/")[0] not in tfds.list_builders(with_community_datasets=False):
        raise DataError(f"--data {data_path}: {name!r} is not a tensorflow-datasets name (see tfds.list_builders())")
    try:
        return tfds.load(name, split=given or split, as_supervised=as_supervised, download=False, shuffle_files=False)
    except Exception as error:  # noqa: BLE001 - tfds raises several kinds for data that is not prepared
        raise DataError(f"--data {data_path}: not in the local tensorflow-datasets folder "
                        f"({type(error).__name__}); on a machine with a network run `tfds build {name}` and copy "
                        "~/tensorflow_datasets here") from None


def tfds_corpus(data_path: str) -> "Corpus":
    """Reads a tfds text data set (``lm1b``, ``tiny_shakespeare``, ...) as a corpus of non-blank lines.

    Every string feature of every example is split into lines.

    Raises:
        DataError: see ``tfds_dataset``; or the data set has no text.
    """
    from seqapps.data.text import Corpus

    lines = []
    for example in tfds_dataset(data_path).as_numpy_iterator():
        for value in example.values() if isinstance(example, dict) else [example]:
            if isinstance(value, bytes):
                lines.extend(line.strip() for line in value.decode("utf-8", "replace").splitlines())
    lines = [line for line in lines if line]
    if not lines:
        raise DataError(f"--data {data_path}: the data set has no text features")
    return Corpus(lines, data_path, "see the tensorflow-datasets catalog")


def read_corpus(data_path: str) -> "Corpus":
    """A text pipeline's ``--data``: a tfds text data set or a UTF-8 text file."""
    from seqapps.data import text

    return tfds_corpus(data_path) if is_tfds(data_path) else text.read_text_file(data_path)


def tfds_images(data_path: str) -> dict[str, tuple[Any, Any]]:
    """Reads a tfds image classification set (``mnist``, ``fashion_mnist``, ...) as arrays.

    Args:
        data_path: ``tfds:NAME`` (its train and test splits) or ``tfds:NAME:SPLIT``
            (that split only, returned as "train").

    Returns:
        ``{"train", "test"?}`` -> (float32 (n, h, w) in 0..255 of the first channel, int64 labels).
    """
    import numpy as np

    named = data_path.count(":") >= 2
    result = {}
    for split in (["train"] if named else ["train", "test"]):
        images, labels = [], []
        for image, label in tfds_dataset(data_path, split, as_supervised=True).as_numpy_iterator():
            images.append(image[..., 0])
            labels.append(label)
        result[split] = (np.asarray(images, np.float32), np.asarray(labels, np.int64))
    return result


def tfds_pairs(data_path: str) -> "Pairs":
    """Reads a tfds translation data set (``ted_hrlr_translate/pt_to_en``, ``para_crawl/enfr``, ...) as pairs.

    The data set's supervised keys say which language is the source and which the target.

    Args:
        data_path: ``tfds:NAME`` (its train split) or ``tfds:NAME:SPLIT``.

    Raises:
        DataError: see ``tfds_dataset``; or the data set is not text pairs.
    """
    from seqapps.data.pairs import Pairs

    sources, targets = [], []
    for example in tfds_dataset(data_path, as_supervised=True).as_numpy_iterator():
        if not (isinstance(example, tuple) and len(example) == 2 and all(isinstance(v, bytes) for v in example)):
            raise DataError(f"--data {data_path}: expected (source, target) text pairs, as translation data sets "
                            "give; this one is not a translation data set")
        sources.append(example[0].decode("utf-8", "replace"))
        targets.append(example[1].decode("utf-8", "replace"))
    return Pairs(sources, targets, [f"example {i + 1}" for i in range(len(sources))], data_path,
                 "see the tensorflow-datasets catalog")


def _tfds_examples_and_features(data_path: str) -> tuple[Any, Any]:
    """The examples of ``tfds:NAME[:SPLIT]`` (see ``tfds_dataset``) and the set's feature dict."""
    import tensorflow_datasets as tfds

    examples = tfds_dataset(data_path)  # checks the name and that the data is local
    return examples, tfds.builder(data_path[len(TFDS_PREFIX):].partition(":")[0]).info.features


def _tfds_folder(data_path: str, build: Callable[[Path], None]) -> Path:
    """The folder ``build`` writes a tfds set into once: ``$SEQAPPS_DATA/tfds/<NAME[_SPLIT]>``, built atomically."""
    import re

    from seqapps.data.files import build_folder_atomically, data_home

    return build_folder_atomically(data_home() / "tfds" / re.sub(r"[^\w.-]+", "_", data_path[len(TFDS_PREFIX):]),
                                   build)


def tfds_audio_folder(data_path: str) -> Path:
    """Writes a tfds speech set (``librispeech``, ``ljspeech``, ...) once as the folder ``--data`` reads.

    The folder holds one WAV file per example (at the set's sample rate) and a
    ``metadata.csv`` of ``path,transcript``; it is built atomically under
    ``$SEQAPPS_DATA/tfds/`` and reused by later runs.

    Args:
        data_path: ``tfds:NAME`` (its train split) or ``tfds:NAME:SPLIT``.

    Returns:
        The folder.

    Raises:
        DataError: see ``tfds_dataset``; or the set has no audio and text features.
    """
    import csv

    import numpy as np
    import soundfile
    import tensorflow_datasets as tfds

    examples, features = _tfds_examples_and_features(data_path)
    audio = [key for key, feature in features.items() if isinstance(feature, tfds.features.Audio)]
    text = [key for key, feature in features.items() if isinstance(feature, tfds.features.Text)]
    if not audio or not text:
        raise DataError(f"--data {data_path}: expected a speech data set with audio and text features, got "
                        f"{', '.join(features.keys())}")
    rate = features[audio[0]].sample_rate

    def build(folder: Path) -> None:
        with open(folder / "metadata.csv", "w", newline="", encoding="utf-8") as table:
            writer = csv.writer(table)
            writer.writerow(["path", "transcript"])
            for number, example in enumerate(examples.as_numpy_iterator()):
                waveform = example[audio[0]]
                if np.issubdtype(waveform.dtype, np.integer):
                    waveform = waveform.astype(np.int16)  # tfds keeps 16-bit PCM in int64
                soundfile.write(folder / f"{number:07d}.wav", waveform, rate)
                writer.writerow([f"{number:07d}.wav", example[text[0]].decode("utf-8", "replace")])

    return _tfds_folder(data_path, build)


def tfds_caption_folder(data_path: str) -> Path:
    """Writes a tfds captioning set (``coco_captions``, ...) once as the folder ``--data`` reads.

    The folder holds one JPEG per example and a ``captions.csv`` of ``image,caption``
    (a row per caption: the ``captions/text`` of COCO, or the set's one text feature);
    it is built atomically under ``$SEQAPPS_DATA/tfds/`` and reused by later runs.

    Args:
        data_path: ``tfds:NAME`` (its train split) or ``tfds:NAME:SPLIT``.

    Returns:
        The folder.

    Raises:
        DataError: see ``tfds_dataset``; or the set has no image and caption features.
    """
    import csv

    import numpy as np
    import tensorflow_datasets as tfds
    from PIL import Image

    from seqapps.data.captions import CAPTIONS_FILE

    examples, features = _tfds_examples_and_features(data_path)
    images = [key for key, feature in features.items() if isinstance(feature, tfds.features.Image)]
    texts = [key for key, feature in features.items() if isinstance(feature, tfds.features.Text)
             and "filename" not in key]
    if not images or not ("captions" in features or texts):
        raise DataError(f"--data {data_path}: expected a captioning data set with image and caption features, got "
                        f"{', '.join(features.keys())}")

    def build(folder: Path) -> None:
        with open(folder / CAPTIONS_FILE, "w", newline="", encoding="utf-8") as table:
            writer = csv.writer(table)
            writer.writerow(["image", "caption"])
            for number, example in enumerate(examples.as_numpy_iterator()):
                name = f"{number:07d}.jpg"
                Image.fromarray(np.squeeze(example[images[0]])).save(folder / name, "JPEG", quality=95)
                found = example["captions"]["text"] if "captions" in features else [example[texts[0]]]
                for caption in found:
                    writer.writerow([name, caption.decode("utf-8", "replace")])

    return _tfds_folder(data_path, build)
