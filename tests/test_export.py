import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2

from seqapps import export, export_format, serializable
from seqapps.errors import ExportError

REPO = Path(__file__).resolve().parents[1]


def small_model() -> keras.Model:
    inputs = keras.Input((3, 2), name="x")
    return keras.Model(inputs, keras.layers.Dense(1)(keras.layers.GRU(4)(inputs)))


def write(model, root, serve=None, inputs=None):
    inputs = inputs or {"x": tf.TensorSpec([None, 3, 2], tf.float32)}
    serve = serve or (lambda features: {"y": model(features["x"])})
    example = {"x": np.ones((2, 3, 2), "float32")}
    signature = export.Signature(inputs, example, run=serve)
    return export.write_export(export.ServingModule(model, {"serving_default": signature}), root,
                               "pipeline: toy\nconfig: {}\n", {"metrics": {"mae": 1.0}}, {"columns": ["x"]},
                               export.Limits(max_batch_size=8))


def test_versions_are_atomic_and_never_overwritten(tmp_path):
    model = small_model()
    root = tmp_path / "toy"
    assert write(model, root).name == "1"
    assert write(model, root).name == "2"

    def broken(inputs):
        raise RuntimeError("crash while tracing")

    with pytest.raises(RuntimeError, match="crash while tracing"):
        write(model, root, serve=broken)
    assert sorted(p.name for p in root.iterdir()) == ["1", "2"]  # no partial version, no temp folder left


def test_folders_not_named_by_ascii_digits_do_not_stop_an_export(tmp_path):
    root = tmp_path / "toy"
    for name in ("\u00b2", "\u0661", "9" * 200, "abc"):  # int("\u00b2") raised after training (issue 15)
        (root / name).mkdir(parents=True)
    assert export_format.version_dirs(root) == {}
    assert write(small_model(), root).name == "1"


def test_a_model_with_non_finite_outputs_is_not_exported(tmp_path):
    """A diverged model is refused, in one message that names the export root, and leaves no folder behind."""
    model = small_model()
    root = tmp_path / "toy"
    with pytest.raises(ExportError, match=r"toy: not exported: output 'y' of signature 'serving_default' is not finite"):
        write(model, root, serve=lambda features: {"y": model(features["x"]) * np.inf})
    assert list(root.iterdir()) == []


def test_every_input_needs_a_leading_batch_dimension(tmp_path):
    model = small_model()
    with pytest.raises(ExportError, match="leading batch dimension"):
        write(model, tmp_path / "toy", inputs={"x": tf.TensorSpec([3, 2], tf.float32)})
    assert not (tmp_path / "toy").exists() or not any((tmp_path / "toy").iterdir())


def test_several_signatures_each_get_a_warmup_request_and_limits(tmp_path):
    model = small_model()
    example = {"x": np.ones((2, 3, 2), "float32")}
    signatures = {
        "serving_default": export.Signature({"x": tf.TensorSpec([None, 3, 2], tf.float32)}, example,
                                            run=lambda f: {"y": model(f["x"])}),
        "doubled": export.Signature({"x": tf.TensorSpec([None, 3, 2], tf.float32)}, example,
                                    preprocess=lambda f: f["x"] * 2.0, run=model,
                                    postprocess=lambda y, raw: {"y": y, "rows": tf.shape(raw["x"])[:1]}),
    }
    path = export.write_export(export.ServingModule(model, signatures), tmp_path / "toy", "pipeline: toy\n", {}, {},
                               export.Limits(max_batch_size=4, max_string_bytes=100))
    logs = export_format.read_warmup_requests(path / "assets.extra" / export_format.WARMUP_FILE)
    assert [log.predict_log.request.model_spec.signature_name for log in logs] == ["serving_default", "doubled"]
    assert export_format.read_limits(path) == export.Limits(max_batch_size=4, max_string_bytes=100)
    served = tf.saved_model.load(str(path)).signatures["doubled"](x=tf.ones((2, 3, 2)))
    np.testing.assert_allclose(served["y"].numpy(), model(2 * np.ones((2, 3, 2), "float32")).numpy(), atol=1e-6)
    assert served["rows"].numpy().tolist() == [2]


def test_export_contents_warmup_and_reload(tmp_path):
    model = small_model()
    path = write(model, tmp_path / "toy")
    info = export_format.read_export(tmp_path / "toy")  # the model folder means its latest version
    assert info.path == path and info.pipeline == "toy" and info.state == {"columns": ["x"]}
    assert export.cudnn_ops(path) == []
    (log,) = export_format.read_warmup_requests(path / "assets.extra" / export_format.WARMUP_FILE)
    assert export_format.read_limits(path).max_batch_size == 8
    request = log.predict_log.request
    assert request.model_spec.name == "toy" and request.model_spec.signature_name == "serving_default"
    sent = tensor_pb2.TensorProto.FromString(request.inputs["x"].SerializeToString())
    np.testing.assert_array_equal(tf.make_ndarray(sent), np.ones((2, 3, 2), "float32"))
    served = tf.saved_model.load(str(path)).signatures["serving_default"](x=tf.ones((2, 3, 2)))
    np.testing.assert_allclose(served["y"].numpy(), model(np.ones((2, 3, 2), "float32")).numpy(), atol=1e-6)
    reloaded = serializable.load_model(info.keras_model_path)
    assert json.loads((path / "assets.extra" / "metrics.json").read_text())["metrics"]["mae"] == 1.0
    assert len(reloaded.weights) == len(model.weights)


def test_recurrent_layers_trace_without_cudnn_and_are_restored():
    model = small_model()
    gru = model.layers[1]
    assert gru.use_cudnn == "auto"
    with export.cpu_compatible_recurrent_layers(model):
        assert gru.use_cudnn is False
    assert gru.use_cudnn == "auto"


def test_read_export_rejects_wrong_folders(tmp_path):
    with pytest.raises(ExportError, match="no such export folder"):
        export_format.read_export(tmp_path / "missing")
    with pytest.raises(ExportError, match="not a SavedModel export"):
        export_format.read_export(tmp_path)
    (tmp_path / "toy" / "1").mkdir(parents=True)
    (tmp_path / "toy" / "1" / "saved_model.pb").write_bytes(b"")
    with pytest.raises(ExportError, match="incomplete export, missing config.yaml"):
        export_format.read_export(tmp_path / "toy" / "1")


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2); tag and length fit one varint byte here."""
    assert number < 16 and len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_warmup_records_have_tf_servings_field_numbers(tmp_path):
    value = np.array([[1.5]], "float32")
    export_format.write_warmup_requests(tmp_path / "warmup", "toy", {"serving_default": {"x": value}})
    (record,) = [record.numpy() for record in tf.data.TFRecordDataset(str(tmp_path / "warmup"))]
    # tensorflow_serving/apis: PredictionLog.predict_log = 6, PredictLog.request = 1, PredictRequest.model_spec = 1
    # and .inputs = 2 (map entries: key 1, value 2), ModelSpec.name = 1 and .signature_name = 3.
    spec = _field(1, b"toy") + _field(3, b"serving_default")
    inputs = _field(2, _field(1, b"x") + _field(2, tf.make_tensor_proto(value).SerializeToString()))
    assert record == _field(6, _field(1, _field(1, spec) + inputs))


def test_read_limits_leaves_unset_bounds_none_and_refuses_bad_files(tmp_path):
    assert export_format.read_limits(tmp_path) is None  # a SavedModel seqapps did not write
    (tmp_path / "assets.extra").mkdir()
    limits_file = tmp_path / "assets.extra" / export_format.LIMITS_FILE
    limits_file.write_text(json.dumps({"max_batch_size": 4, "max_string_bytes": None, "later_field": 7}))
    assert export_format.read_limits(tmp_path) == export_format.Limits(max_batch_size=4)
    limits_file.write_text(json.dumps({"max_generated_length": 10}))
    assert export_format.read_limits(tmp_path) == export_format.Limits(max_batch_size=None, max_generated_length=10)
    for bad in ('{"max_batch_size": -1}', '{"max_batch_size": true}', '[4]', '{"max_batch_size": 4'):
        limits_file.write_text(bad)
        with pytest.raises(ExportError, match="limits.json"):
            export_format.read_limits(tmp_path)


def test_the_export_format_imports_neither_tensorflow_nor_keras():
    script = "import sys, seqapps.export_format; print(sorted({'tensorflow', 'keras'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    assert done.stdout.strip() == "[]"


def test_an_examples_signature_parses_tf_examples_and_carries_its_method_name(tmp_path):
    from tensorflow.core.protobuf import saved_model_pb2

    model = small_model()
    default = export.Signature({"x": tf.TensorSpec([None, 3, 2], tf.float32)}, {"x": np.ones((2, 3, 2), "float32")},
                               run=lambda f: {"y": model(f["x"])})
    regress = export.examples_signature(default, export_format.REGRESS_METHOD, lambda out: {"outputs": out["y"][:, 0]})
    path = export.write_export(export.ServingModule(model, {"serving_default": default, "regress": regress}),
                               tmp_path / "toy", "pipeline: toy\n", {}, {})
    defs = saved_model_pb2.SavedModel.FromString((path / "saved_model.pb").read_bytes()).meta_graphs[0].signature_def
    assert defs["regress"].method_name == export_format.REGRESS_METHOD
    assert defs["serving_default"].method_name == export_format.PREDICT_METHOD
    # seqapps predict finds the signature whose inputs the tf.Examples hold
    assert export_format.read_examples_signatures(path) == {"regress": "serving_default"}
    x = np.random.default_rng(0).normal(size=(3, 3, 2)).astype("float32")
    regress_served = tf.saved_model.load(str(path)).signatures["regress"]
    served = regress_served(inputs=tf.constant(export.serialize_examples({"x": x})))
    np.testing.assert_allclose(served["outputs"].numpy(), model(x).numpy()[:, 0], atol=1e-6)

    orphan = export.examples_signature(default, export_format.REGRESS_METHOD, lambda out: {"outputs": out["y"][:, 0]})
    with pytest.raises(ExportError, match="'regress' wraps a signature the module does not export"):
        export.write_export(export.ServingModule(model, {"serving_default": dataclasses.replace(default),
                                                         "regress": orphan}), tmp_path / "toy", "pipeline: toy\n", {}, {})
    assert export_format.read_examples_signatures(tmp_path / "nowhere") == {}
    with pytest.raises(ExportError, match="'n' .*cannot be a tf.Example feature"):
        export.examples_signature(export.Signature({"n": tf.TensorSpec([None], tf.int32)}, {}, run=dict),
                                  export_format.REGRESS_METHOD, dict)
