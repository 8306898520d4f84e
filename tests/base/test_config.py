import pytest

from tinygpt.base import config
from tinygpt.base.config import ConfigError


def test_defaults_are_valid():
    cfg = config.resolve([])
    assert cfg.model.n_layer >= 1 and cfg.run.resume == "auto"


def test_dashes_underscores_and_equals_all_work():
    cfg = config.resolve(["--n-layer", "6", "--n_embd=384", "--n-head", "6", "--lr", "1e-3", "--no-pos-emb", "--bias"])
    assert (cfg.model.n_layer, cfg.model.n_embd, cfg.optim.lr) == (6, 384, 1e-3)
    assert cfg.model.pos_emb is False and cfg.model.bias is True


def test_every_mix_of_dashes_and_underscores_names_the_same_key():
    parsed = [config.parse_cli([flag, "0.5"])[0] for flag in
              ("--muon-weight-decay", "--muon_weight-decay", "--muon-weight_decay", "--muon_weight_decay")]
    assert parsed == [{"muon_weight_decay": "0.5"}] * 4


@pytest.mark.parametrize("argv, overrides, problem", [
    (["--lr", "-1e-3"], {"lr": "-1e-3"}, None),  # a value that looks like a short option is still the value
    (["--bias", "--no-bias"], {"bias": False}, None),  # the last one wins
    (["--no-bias", "false"], {"bias": False}, "unexpected argument 'false'"),  # --no-flag takes no value
    (["--no-bias=true"], {}, "unknown option --no-bias (did you mean `bias`?)"),
    (["--bogus", "5", "--n-layer", "2"], {"n_layer": "2"}, "unknown option --bogus;"),  # 5 goes with --bogus
    (["--", "--n-layer", "2"], {"n_layer": "2"}, "unexpected argument '--'"),  # not the end of the options
    (["--n-lay", "2"], {}, "unknown option --n-lay (did you mean `n_layer`?)"),  # no abbreviations
    (["--n-layer", "--bias"], {"bias": True}, "--n-layer: needs a value (number of transformer blocks)"),
    (["--config"], {}, "--config: needs the path of a YAML file"),
])
def test_the_command_line_forms(argv, overrides, problem):
    got, _, problems = config.parse_cli(argv)
    assert got == overrides
    assert len(problems) == (problem is not None) and all(problem in p for p in problems)


def test_precedence_cli_over_yaml_over_defaults(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("model:\n  n_layer: 3\n  n_embd: 96\nlr: 1.0e-2\noptim.max_steps: 7\n")
    cfg = config.resolve(["--config", str(f), "--n-layer", "5"])
    assert cfg.model.n_layer == 5  # CLI wins
    assert cfg.model.n_embd == 96  # YAML over default
    assert cfg.optim.lr == 0.01 and cfg.optim.max_steps == 7
    assert cfg.model.n_head == config.ModelConfig().n_head  # default


def test_yaml_scientific_notation_without_dot_is_a_number(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("lr: 3e-4\n")  # PyYAML reads this as a string; the schema converts it
    assert config.resolve(["--config", str(f)]).optim.lr == 3e-4


def test_unknown_keys_are_rejected_with_suggestion_and_valid_list(tmp_path):
    with pytest.raises(ConfigError) as err:
        config.resolve(["--n-layers", "4"])
    assert "--n-layers" in str(err.value) and "did you mean `n_layer`" in str(err.value)
    f = tmp_path / "run.yaml"
    f.write_text("model:\n  n_embed: 64\n")
    with pytest.raises(ConfigError) as err:
        config.resolve(["--config", str(f)])
    message = str(err.value)
    assert "unknown key `model.n_embed`" in message and "did you mean `n_embd`" in message
    assert "valid keys of `model` are: n_layer, n_head, n_embd" in message


def test_keys_of_the_removed_cpu_layer_are_unknown_keys():
    """run.cpu_kernels and friends never shipped in a release: they are refused like any unknown key."""
    with pytest.raises(ConfigError, match="unknown key `run.cpu_kernels`"):
        config.from_dict({"run": {"cpu_kernels": "on"}})
    with pytest.raises(ConfigError, match="unknown option --cpu-allocator"):
        config.resolve(["--cpu-allocator", "malloc"])


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as err:
        config.resolve(["--lr", "-1", "--dropout", "1.0", "--n-embd", "30", "--n-head", "4", "--batch-size", "x",
                        "--precision", "fp8"])
    problems = err.value.problems
    assert len(problems) == 5, problems
    text = "\n".join(problems)
    for field in ("lr:", "dropout:", "n_embd:", "batch_size:", "precision:"):
        assert field in text
    assert "5 problems" in str(err.value)


def test_yaml_syntax_error_names_the_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("n_layer: 2\nmodel: [1, 2\nlr: 1\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: line \d+, column \d+: YAML syntax error"):
        config.resolve(["--config", str(f)])


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        config.resolve(["--config", str(tmp_path / "nope.yaml")])


def test_wrong_types_are_named():
    with pytest.raises(ConfigError, match="n_layer: expected a whole number, got 2.5"):
        config.resolve(["--n-layer", "2.5"])
    with pytest.raises(ConfigError, match="bias: expected true or false"):
        config.build({"bias": "maybe"})


def test_negative_numbers_are_values_not_flags():
    with pytest.raises(ConfigError, match=r"lr: must be in \(0, 1\], got -0.5"):
        config.resolve(["--lr", "-0.5"])


def test_resolved_config_round_trips_through_yaml(tmp_path):
    cfg = config.resolve(["--n-layer", "3", "--data-file", "x.txt"])
    text = config.dump_yaml(cfg)
    f = tmp_path / "config.yaml"
    f.write_text(text)
    assert config.resolve(["--config", str(f)]) == cfg


def test_help_lists_every_key():
    text = config.help_text()
    for name in config.field_info():
        assert f"--{name.replace('_', '-')}" in text


def test_config_module_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, tinygpt.base.config; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
