"""The HRNN pipelines' shared report parts: the memory bench's result, found beside the export, as a curve and table;
the speech bench's check of its HRNN sizes."""
import io
import json
import types

import numpy as np
import pytest
from PIL import Image

from seqapps import cli, hrnn
from seqapps.bench import hrnn as memory_bench
from seqapps.bench import speech as speech_bench
from seqapps.errors import DataError
from seqapps.report.document import Figure, Table, Text


def bench_rows() -> list[dict]:
    """A fake bench result's rows (no bench is run): k = 10 and k = sqrt(2T) for two lengths, unsorted."""
    rows = []
    for length, period, hrnn_mb, decoupled_mb in [(1000, 10, 50.0, 10.5), (200, 10, 10.0, 2.5),
                                                   (1000, 45, 50.0, 4.5), (200, 20, 10.0, 2.0)]:
        rows.append({"T": length, "k": period, "hrnn_memory_mb": hrnn_mb, "decoupled_memory_mb": decoupled_mb,
                     "hrnn_step_s": 0.1, "decoupled_step_s": 0.12, "device": "cpu",
                     "memory_ratio": round(hrnn_mb / decoupled_mb, 2),
                     "theory_ratio": round(length / (period + 2 * length / period), 2), "time_ratio": 1.2})
    return rows


def test_the_bench_writes_its_out_file_and_the_report_reads_it_beside_the_export(tmp_path):
    result = {"config": {"units": 8}, "results": bench_rows(), "targets": {}}
    memory_bench.write_result(tmp_path / "runs" / memory_bench.RESULT_IN_LOGDIR, result)
    arrays = hrnn.bench_report_data(tmp_path / "saved_models" / "copy_task" / "1")
    np.testing.assert_array_equal(arrays["bench/T"], [1000, 200, 1000, 200])
    np.testing.assert_array_equal(arrays["bench/decoupled_memory_mb"], [10.5, 2.5, 4.5, 2.0])
    assert json.loads(str(arrays["bench/config"])) == {"units": 8}
    section = hrnn.mode_and_bench_sections({"config": {"mode": "hrnn"}}, arrays, [("bpc", "bits per char")])[1]
    figure, table = [block for block in section.blocks if isinstance(block, (Figure, Table))]
    assert section.id() == "memory-bench" and Image.open(io.BytesIO(figure.png)).format == "PNG"
    assert [row[:4] for row in table.rows] == [[200, 10, 10.0, 2.5], [200, 20, 10.0, 2.0], [1000, 10, 50.0, 10.5],
                                               [1000, 45, 50.0, 4.5]]  # by T


def test_without_a_bench_file_the_section_says_how_to_get_one(tmp_path):
    assert hrnn.bench_report_data(tmp_path / "saved_models" / "copy_task" / "1") == {}
    section = hrnn.mode_and_bench_sections({}, {}, [("bpc", "bits per char")])[1]
    assert [type(block) for block in section.blocks] == [Text]
    assert "seqapps bench hrnn --out runs/bench/hrnn.json" in section.blocks[0].text


@pytest.mark.parametrize("content, message", [
    ("not json", "expected the JSON of seqapps bench hrnn --out"),
    (json.dumps({"results": [{"T": 200}]}), "'k' is missing"),
    (json.dumps({"results": []}), "it has none"),
])
def test_a_file_that_is_no_bench_result_is_a_data_error_naming_it(tmp_path, content, message):
    path = tmp_path / "runs" / memory_bench.RESULT_IN_LOGDIR
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(DataError, match=message) as raised:
        hrnn.bench_report_data(tmp_path / "saved_models" / "copy_task" / "1")
    assert str(path) in str(raised.value)


def test_run_writes_out_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.setattr(memory_bench, "_run_worker", lambda mode, length, period, args: {
        "memory_mb": 10.0 if mode == "hrnn" else 2.0, "step_s": 0.1, "device": "cpu"})
    args = types.SimpleNamespace(seq_lengths="200", periods="10", units=8, batch=2, steps=1, seed=0,
                                 out=str(tmp_path / "bench.json"))
    result = memory_bench.run(args)
    assert memory_bench.read_result(tmp_path / "bench.json") == json.loads(json.dumps(result))
    assert result["results"][0]["memory_ratio"] == 5.0


@pytest.mark.parametrize("value", ["abc", "0,5", "64", "64,", "1.5,2"])
def test_speech_bench_bad_hrnn_units_is_one_line_naming_the_option(capfd, monkeypatch, value):
    def no_worker(module, options):
        raise AssertionError("a measurement started despite a bad --hrnn-units")

    monkeypatch.setattr(speech_bench.steps_harness, "run_worker", no_worker)
    code = cli.main(["bench", "speech", "--hrnn-units", value])
    lines = capfd.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0] == (f"seqapps: error: --hrnn-units: got {value!r}, expected two or more comma-separated "
                        "integers >= 1 (one per HRNN level, e.g. 124,124)")


@pytest.mark.parametrize("value", ["abc", "0", "64,x", ","])
def test_speech_bench_bad_birnn_units_is_one_line_naming_the_option(capfd, monkeypatch, value):
    monkeypatch.setattr(speech_bench.steps_harness, "run_worker", lambda module, options: pytest.fail("it ran"))
    code = cli.main(["bench", "speech", "--birnn-units", value])
    lines = capfd.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0] == (f"seqapps: error: --birnn-units: got {value!r}, expected one or more comma-separated "
                        "integers >= 1 (one per BiGRU layer, e.g. 128,128)")


@pytest.mark.parametrize("value, passed", [("124, 124", "124,124"), ("", "")])
def test_speech_bench_passes_good_units_to_each_worker(capfd, monkeypatch, value, passed):
    workers = []

    def fake_worker(module, options):
        workers.append(options)
        return {"frames": 10, "device": "cpu", "memory_mb": 1.0, "step_s": 0.1, "parameters": 5}

    monkeypatch.setattr(speech_bench.steps_harness, "run_worker", fake_worker)
    code = cli.main(["bench", "speech", "--hrnn-units", value, "--birnn-units", "96", "--seconds", "5",
                     "--encoders", "birnn,hrnn"])
    assert code == 0 and [options["encoder"] for options in workers] == ["birnn", "hrnn"]
    assert all(options["hrnn_units"] == passed and options["birnn_units"] == "96" for options in workers)
    assert json.loads(capfd.readouterr().out)["config"]["hrnn_units"] == passed


def test_speech_bench_gives_each_encoder_its_own_units():
    from seqapps.config import resolve_config
    from seqapps.pipeline import REGISTRY

    def units(encoder, **given):
        overrides = speech_bench.encoder_overrides(encoder, **given)
        return resolve_config(REGISTRY.get("speech_recognition").Config, "tiny", overrides=overrides).units

    assert units("birnn", hrnn_units="6,6", birnn_units="5,3") == [5, 3]
    assert units("hrnn", hrnn_units="6,6", birnn_units="5,3") == units("bihrnn", hrnn_units="6,6") == [6, 6]
    assert units("birnn", hrnn_units="6,6") == [16]  # the preset's
