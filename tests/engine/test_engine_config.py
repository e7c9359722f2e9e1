"""load_config / save_config: YAML over defaults, typed dotted overrides, unknown keys refused."""

from __future__ import annotations

import json

import pytest

from lightvision.engine import ConfigError, load_config, save_config, upgrade_config

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


def test_base_chain_is_merged_in_order_and_relative_to_the_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "root.yaml").write_text("optim: {lr: 1.0}\nmodel: {name: a}\n")
    (tmp_path / "sub" / "mid.yaml").write_text("base: ../root.yaml\nmodel: {name: b}\n")
    (tmp_path / "sub" / "top.yaml").write_text("base: mid.yaml\noptim: {lr: 3.0}\n")
    cfg = load_config(tmp_path / "sub" / "top.yaml", ["model.name=c"], DEFAULTS)
    assert cfg["optim"]["lr"] == 3.0 and cfg["model"]["name"] == "c" and "base" not in cfg
    assert load_config(tmp_path / "sub" / "mid.yaml", [], DEFAULTS)["model"]["name"] == "b"
    (tmp_path / "loop.yaml").write_text("base: loop.yaml\n")
    with pytest.raises(ConfigError, match="names itself"):
        load_config(tmp_path / "loop.yaml", [], DEFAULTS)


@pytest.mark.parametrize(
    "text, override, new",
    [
        ("run_dir: runs/x\n", None, "run.dir"),
        ("model: {kwargs: {depth: 2}}\n", None, "model.args"),
        ("model: {args: {attention_kwargs: {lrpe: global}}}\n", None, "model.args.attn_kwargs"),
        (None, "data.test_split=test", "data.val_split"),
        (None, "optim.warmup_steps=10", "sched.warmup_steps"),
        (None, "model.kwargs.depth=3", "model.args.depth"),
        (None, "data.batch_size=256", "train.batch_size"),
    ],
)
def test_renamed_keys_are_refused_naming_the_new_key(tmp_path, text, override, new):
    defaults = {"model": {"name": "m", "args": {}}, "data": {"batch_size": 1}}
    recipe = None
    if text is not None:
        recipe = tmp_path / "old.yaml"
        recipe.write_text(text)
    with pytest.raises(ConfigError, match=f"was renamed: use '{new}'"):
        load_config(recipe, [override] if override else [], defaults)


def test_saved_config_of_the_old_layout_is_upgraded():
    old = {
        "base": None,
        "run_dir": "runs/x",
        "seed": 3,
        "model": {"name": "m", "kwargs": {"attention_kwargs": {"lrpe": "global"}, "depth": 2}},
        "data": {"test_split": "test", "batch_size": 256, "image_size": 32},
        "optim": {"lr": 1e-4, "warmup_steps": 10},
        "train": {"grad_accum_steps": 2, "ckpt_every": 5, "eval_every": 0, "clip_grad": 1.0},
    }
    new = upgrade_config(old)
    assert new == {
        "run": {"dir": "runs/x"},
        "model": {"name": "m", "args": {"attn_kwargs": {"lrpe": "global"}, "depth": 2}},
        "data": {"val_split": "test", "image_size": 32},
        "optim": {"lr": 1e-4, "clip_grad": 1.0},
        "train": {"grad_accum_steps": 2, "ckpt_every_steps": 5, "eval_every_steps": 0, "seed": 3, "batch_size": 128},
        "sched": {"warmup_steps": 10},
    }
    assert old["run_dir"] == "runs/x"  # the input is left as it was
    assert upgrade_config(new) == new
