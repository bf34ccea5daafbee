"""Exports written before issue 23's rework still serve, predict and fine-tune (``tests/legacy_exports``)."""
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
import tensorflow as tf

from seqapps import cli, serving
from seqapps.pipeline import REGISTRY

LEGACY = Path(__file__).parent / "legacy_exports"
#: one row of TF Serving's row format for each export's ``serving_default``
INSTANCES = {"translation": [{"text": "the man is old"}, {"text": ""}],
             "text_generation": [{"prompt": "The", "length": 12, "temperature": 0.0, "top_k": 0}]}


@pytest.fixture()
def model_root(tmp_path: Path) -> Path:
    """A copy of the legacy exports (the tests write new versions and must not touch the repository's)."""
    shutil.copytree(LEGACY, tmp_path / "models", ignore=shutil.ignore_patterns("*.md"))
    return tmp_path / "models"


def test_the_server_serves_legacy_exports_as_tensorflow_runs_them(model_root):
    with serving.serve_in_thread(model_root, serving.ServingOptions(poll_seconds=0.2)) as url:
        with httpx.Client(base_url=url, timeout=120) as client:
            for name, instances in INSTANCES.items():
                status = client.get(f"/v1/models/{name}").json()
                assert status["model_version_status"][0]["state"] == "AVAILABLE", status
                response = client.post(f"/v1/models/{name}:predict", json={"instances": instances})
                assert response.status_code == 200, response.text
                served = response.json()["predictions"]
                function = tf.saved_model.load(str(model_root / name / "1")).signatures["serving_default"]
                specs = function.structured_input_signature[1]
                direct = function(**{key: tf.constant([row[key] for row in instances], specs[key].dtype)
                                     for key in specs})
                for row, prediction in enumerate(served):
                    for key, value in direct.items():
                        expected = value.numpy()[row]
                        if value.dtype == tf.string:
                            assert prediction[key] == expected.decode(), (name, key)
                        else:
                            np.testing.assert_allclose(prediction[key], expected, rtol=1e-5, err_msg=f"{name}:{key}")


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_predict_reads_a_legacy_export_on_every_signature(model_root, capsys, name):
    path = model_root / name / "1"
    signatures = sorted(tf.saved_model.load(str(path)).signatures)
    assert "serving_default" in signatures
    for signature in signatures:
        capsys.readouterr()
        assert cli.main(["predict", str(path), "the old man", "--signature", signature]) == 0, signature
        out, err = capsys.readouterr()
        assert "the old man" in out and err == "", (signature, out, err)


def test_finetune_continues_from_a_legacy_export(model_root, tmp_path, capsys):
    data, _ = REGISTRY.get("text_generation")().write_sample_data(tmp_path)
    code = cli.main(["finetune", "text_generation", "--from", str(model_root / "text_generation" / "1"),
                     "--data", data, "--set", "epochs=1", "--set", "steps_per_epoch=2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert (model_root / "text_generation" / "2" / "saved_model.pb").is_file()
    assert "before finetune" in out  # the summary compares the legacy model with the fine-tuned one
