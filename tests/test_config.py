import dataclasses

import pytest

from seqapps.config import TrainingConfig, dump_config, require_split_fractions, resolve_config
from seqapps.errors import ConfigError
from seqapps.pipeline import REGISTRY
from tests.pipelines.cli_runner import assert_rejected_in_one_line


@dataclasses.dataclass
class ToyConfig(TrainingConfig):
    columns: list[str] = dataclasses.field(default_factory=lambda: ["a"])
    horizon: int | str = "1D"
    window: int | None = None
    sizes: list[int] = dataclasses.field(default_factory=lambda: [1])
    PRESETS = {"tiny": {"epochs": 1, "horizon": 3}, "default": {}, "full": {"epochs": 99}}


def test_precedence_defaults_preset_file_then_set(tmp_path):
    config_file = tmp_path / "c.yaml"
    config_file.write_text("epochs: 5\nlearning_rate: 0.5\n")
    config = resolve_config(ToyConfig, "tiny", config_file, ["learning_rate=0.25", "columns=x,y"])
    assert config.epochs == 5            # the file beats the preset
    assert config.horizon == 3           # the preset beats the default
    assert config.learning_rate == 0.25  # --set beats the file
    assert config.columns == ["x", "y"]
    assert config.batch_size == 64       # untouched default


def test_union_and_optional_fields_coerce():
    config = resolve_config(ToyConfig, "default", None, ["horizon=7D", "window=12"])
    assert config.horizon == "7D" and config.window == 12
    assert resolve_config(ToyConfig, "default", None, ["window=null"]).window is None


def test_comma_lists_coerce_their_items():
    assert resolve_config(ToyConfig, "default", None, ["sizes=64,32,16"]).sizes == [64, 32, 16]
    assert resolve_config(ToyConfig, "default", None, ["sizes=[8, 4]"]).sizes == [8, 4]
    with pytest.raises(ConfigError, match="'sizes'.*expected an integer"):
        resolve_config(ToyConfig, "default", None, ["sizes=64,x"])


@pytest.mark.parametrize("override, message", [
    ("epoch=3", "did you mean 'epochs'"),
    ("epochs=three", "expected an integer"),
    ("epochs=0", "expected an integer >= 1"),
    ("optimizer=rmsprop", "one of adam, sgd"),
    ("novalue", "expected key=value"),
])
def test_bad_overrides_name_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        resolve_config(ToyConfig, "default", None, [override])


def test_bad_file_and_preset(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        resolve_config(ToyConfig, "default", tmp_path / "missing.yaml")
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        resolve_config(ToyConfig, "default", listing)
    with pytest.raises(ConfigError, match="unknown preset"):
        resolve_config(ToyConfig, "huge")


def test_saved_config_round_trips():
    import yaml

    config = resolve_config(ToyConfig, "tiny", None, ["columns=p,q"])
    saved = yaml.safe_load(dump_config(config, "toy", "tiny"))
    assert saved["pipeline"] == "toy" and saved["preset"] == "tiny"
    assert resolve_config(ToyConfig, "tiny", base=saved["config"]) == config


def test_a_field_the_saved_config_predates_takes_the_preset_value_then_the_default():
    saved = resolve_config(ToyConfig, "full", None, ["learning_rate=0.25"]).to_dict()
    del saved["epochs"], saved["window"]  # as an export written before these fields existed
    config = resolve_config(ToyConfig, "full", base=saved)
    assert config.epochs == 99 and config.window is None and config.learning_rate == 0.25
    assert resolve_config(ToyConfig, "full", None, ["epochs=3"], base=saved).epochs == 3  # --set still wins


def test_exponent_floats_without_a_dot_are_numbers():
    from seqapps.config import TrainingConfig, resolve_config

    assert resolve_config(TrainingConfig, "default", overrides=["learning_rate=3e-4"]).learning_rate == 3e-4


SPLITTING = [name for name in REGISTRY.names() if "val_fraction" in REGISTRY.config_outline(name).fields]


def test_every_pipeline_but_the_generated_copy_task_takes_split_fractions():
    assert sorted(set(REGISTRY.names()) - set(SPLITTING)) == ["copy_task"]


@pytest.mark.parametrize("name", SPLITTING)
@pytest.mark.parametrize("fractions", [("0", "0.1"), ("0.6", "0.5")])
def test_split_fractions_are_checked_in_one_line(capsys, tmp_path, name, fractions):
    val_fraction, test_fraction = fractions
    assert_rejected_in_one_line(capsys, tmp_path, name, ["--set", f"val_fraction={val_fraction}",
                                                         "--set", f"test_fraction={test_fraction}"],
                                "config field 'val_fraction/test_fraction'")


def test_any_shares_above_0_summing_below_1_are_taken():
    require_split_fractions(0.45, 0.45)
    with pytest.raises(ConfigError, match=r"got \(0.5, 0.5\), expected shares > 0 summing below 1"):
        require_split_fractions(0.5, 0.5)
