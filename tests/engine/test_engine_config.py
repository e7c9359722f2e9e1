"""load_config / save_config: YAML over defaults, typed dotted overrides, unknown keys refused."""

from __future__ import annotations

import json

import pytest

from lightvision.engine import ConfigError, load_config, save_config

DEFAULTS = {
    "model": {"name": "deit_tiny", "depth": 12},
    "optim": {"lr": 1e-3, "betas": [0.9, 0.999]},
    "epochs": 300,
    "extra": {},
}


def test_yaml_over_defaults_and_typed_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  depth: 6\noptim:\n  lr: 5e-4\n")
    cfg = load_config(
        recipe,
        ["optim.lr=1e-4", "epochs=3", "model.name=lion_s", "optim.betas=[0.9, 0.95]", "extra.anything=true"],
        DEFAULTS,
    )
    assert cfg["model"] == {"name": "lion_s", "depth": 6}
    assert cfg["optim"]["lr"] == 1e-4 and isinstance(cfg["optim"]["lr"], float)
    assert cfg["epochs"] == 3 and isinstance(cfg["epochs"], int)
    assert cfg["optim"]["betas"] == [0.9, 0.95]
    assert cfg["extra"] == {"anything": True}
    assert DEFAULTS["optim"]["lr"] == 1e-3, "defaults must not be mutated"


def test_yaml_alone_defines_known_keys(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("lr: 1.0e-3\nwarmup: 5\n")
    assert load_config(recipe, ["warmup=10"]) == {"lr": 1e-3, "warmup": 10}
    with pytest.raises(ConfigError, match="unknown config key 'warmpu'.*did you mean warmup"):
        load_config(recipe, ["warmpu=10"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.lrr=1", "unknown config key 'optim.lrr'.*did you mean optim.lr"),
        ("epoch=3", "unknown config key 'epoch'.*did you mean epochs"),
        ("model=deit", "'model' is a section"),
        ("epochs.x=1", "'epochs' is a value"),
        ("noequals", "must look like key.sub=value"),
        ("epochs=abc", "'epochs' takes a number, got 'abc'"),
        ("optim.betas=0.9", "'optim.betas' takes a list"),
    ],
)
def test_bad_overrides_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override], DEFAULTS)


def test_null_and_numbers_of_either_kind_are_accepted():
    cfg = load_config(None, ["optim.lr=1", "epochs=null", "model.name=7"], DEFAULTS)
    assert cfg["optim"]["lr"] == 1 and cfg["epochs"] is None and cfg["model"]["name"] == 7


def test_missing_recipe_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"recipe .*nope.yaml not found"):
        load_config(tmp_path / "nope.yaml", [], DEFAULTS)


def test_unknown_yaml_key_refused_with_defaults(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("optim:\n  learning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'optim.learning_rate' in .*r.yaml"):
        load_config(recipe, [], DEFAULTS)


def test_save_config_json(tmp_path):
    save_config(DEFAULTS, tmp_path / "config.json")
    assert json.loads((tmp_path / "config.json").read_text()) == DEFAULTS


def test_open_section_in_defaults_accepts_several_keys_from_file_and_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  args:\n    depth: 2\n    width: 4\n")
    cfg = load_config(recipe, ["model.args.heads=3", "model.args.depth=5"], {"model": {"name": "m", "args": {}}})
    assert cfg["model"]["args"] == {"depth": 5, "width": 4, "heads": 3}
    with pytest.raises(ConfigError, match="model.nme"):
        load_config(recipe, ["model.nme=3"], {"model": {"name": "m", "args": {}}})


def test_check_number_names_the_key_and_the_bound():
    from lightvision.engine.config import check_number

    check_number(3, "train.batch_size", 1, integer=True)
    check_number(None, "train.max_steps", 1, integer=True, optional=True)
    check_number(0.0, "optim.weight_decay", 0)
    refused = [
        ((0, "train.batch_size", 1), {"integer": True}, r"train\.batch_size must be a whole number at least 1, got 0"),
        ((2.0, "train.batch_size", 1), {"integer": True}, r"whole number at least 1, got 2\.0"),
        ((True, "data.num_workers", 0), {"integer": True}, r"got True"),
        ((0, "optim.lr", 0), {"above": True}, r"optim\.lr must be a number above 0, got 0"),
        ((float("nan"), "optim.lr", 0), {"above": True}, r"got nan"),
        (("fast", "optim.lr", 0), {}, r"got 'fast'"),
        ((None, "optim.lr", 0), {"above": True}, r"optim\.lr has no value .*: give a number above 0$"),
        ((0, "train.max_steps", 1), {"integer": True, "optional": True}, r"at least 1 or null, got 0"),
    ]
    for args, kwargs, message in refused:
        with pytest.raises(ConfigError, match=message):
            check_number(*args, **kwargs)
