"""Configuration: the embedded config.toml, --config files and TRACEFIX_<SECTION>_<KEY> variables."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tracefix.daemon.core.config_file import configuration_markdown, default_config_toml, toml_value
from tracefix.daemon.core.settings import ConfigError, Settings, load_settings

REPO = Path(__file__).resolve().parent.parent


REGENERATE = "run `python -m tracefix.daemon.core.settings --write-config --write-docs` and commit the result"


def test_settings_without_a_file_equal_the_embedded_config() -> None:
    assert Settings() == load_settings(environ={})


def test_every_key_of_config_toml_holds_its_field_default() -> None:
    shipped = tomllib.loads((REPO / "config.toml").read_text(encoding="utf-8"))
    defaults = Settings()
    assert set(shipped) == set(Settings.model_fields)
    for section, values in shipped.items():
        model = getattr(defaults, section)
        # Unset (None) defaults are commented out: TOML has no null.
        keys = {key for key in type(model).model_fields if getattr(model, key) is not None}
        assert set(values) == keys, f"[{section}]: config.toml keys differ from the fields; {REGENERATE}"
        for key, value in values.items():
            expected = type(model).model_validate({key: value}).model_dump()[key]
            assert expected == model.model_dump()[key], f"[{section}] {key}: {value!r} in config.toml; {REGENERATE}"


def test_config_toml_is_rendered_from_the_models() -> None:
    text = (REPO / "config.toml").read_text(encoding="utf-8")
    assert text == default_config_toml(), f"config.toml differs from the settings models: {REGENERATE}"


def test_configuration_docs_are_rendered_from_the_models() -> None:
    text = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert text == configuration_markdown(), f"docs/configuration.md differs from the settings models: {REGENERATE}"


def test_configuration_docs_name_every_key_with_its_default() -> None:
    text = configuration_markdown()
    defaults = Settings()
    for section in Settings.model_fields:
        model = getattr(defaults, section)
        assert f"## `[{section}]`" in text
        for key in type(model).model_fields:
            value = getattr(model, key)
            default = "*unset*" if value is None else f"`{toml_value(value)}`".replace("|", "\\|")
            assert f"| `{key}` | " in text and f" | {default} | " in text, f"[{section}] {key}"
    for entry in ("[[capabilities.evaluations]]", "[[llm.custom]]"):
        assert f"### `{entry}` entries" in text


def test_rendered_toml_reads_back_as_the_defaults() -> None:
    values = {"text": 'say "hi"\\ \x7f é', "path": Path("a/b"), "number": 1e-4, "whole": 14400.0, "flag": False,
              "list": [1, 2.5, "x"], "table": {"bf16": True, "odd key": "v"}, "empty": {}}  # fmt: skip
    parsed = tomllib.loads("".join(f"{key} = {toml_value(value)}\n" for key, value in values.items()))
    assert parsed == values | {"path": "a/b"}
    assert isinstance(parsed["whole"], float)


def test_an_unset_setting_is_a_commented_example_in_config_toml() -> None:
    text = default_config_toml()
    assert '# cache_dir = ".tracefix/models"' in text and '# fixed_adapter = "tool_call_precision@v1"' in text
    assert "cache_dir" not in tomllib.loads(text)["model"]


def test_config_file_overrides_only_the_keys_it_names(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('[collector]\nhttp_port = 14318\n[store]\npath = "/tmp/x.duckdb"\n')
    settings = load_settings(path, environ={})
    assert settings.collector.http_port == 14318
    assert settings.collector.grpc_port == 4317
    assert str(settings.store.path) == "/tmp/x.duckdb"


def test_environment_variables_override_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text("[collector]\nhttp_port = 14318\n")
    environ = {
        "TRACEFIX_COLLECTOR_HTTP_PORT": "24318",
        "TRACEFIX_COLLECTOR_TOKEN": "s3cret",
        "TRACEFIX_OUTCOME_SUCCESS_LABELS": "ok,great",
        "TRACEFIX_OUTCOME_EVALUATION_NAMES": '["task_success"]',
        "TRACEFIX_WRITER_MAX_WAIT_MS": "0.5",
    }
    settings = load_settings(path, environ=environ)
    assert settings.collector.http_port == 24318
    assert settings.collector.token == "s3cret"
    assert settings.outcome.success_labels == ["ok", "great"]
    assert settings.outcome.evaluation_names == ["task_success"]
    assert settings.writer.max_wait_ms == 0.5


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[collector]\nhttp_port = 99999\n", "collector.http_port"),
        ("[collector]\nhttp_prot = 1\n", "collector.http_prot"),
        ("[collector\n", "invalid TOML"),
    ],
)
def test_bad_configuration_is_a_clear_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_settings(path, environ={})


def test_an_empty_environment_variable_clears_a_string_setting(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('[collector]\ntoken = "from-file"\n')
    assert load_settings(path, environ={}).collector.token == "from-file"
    assert load_settings(path, environ={"TRACEFIX_COLLECTOR_TOKEN": ""}).collector.token == ""


def test_bad_environment_value_names_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"collector\.grpc_port"):
        load_settings(environ={"TRACEFIX_COLLECTOR_GRPC_PORT": "not-a-port"})


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "absent.toml", environ={})


def test_training_settings_reach_the_trainer_from_the_file_and_the_environment(tmp_path: Path) -> None:
    from tracefix.daemon.core.settings import TrainingSettings
    from tracefix.daemon.pipeline.training_runner import train_config

    path = tmp_path / "gpu.toml"
    path.write_text('[training]\ndtype = "bfloat16"\nlora_dropout = 0.05\n[model]\nmax_new_tokens = 77\nthreads = 3\n')
    config = TrainingSettings.model_validate(train_config(load_settings(path, environ={})))
    assert config.dtype == "bfloat16" and config.lora_dropout == 0.05
    assert config.new_tokens == 77 and config.threads == 3  # [model]'s, where [training] leaves them 0
    environ = {"TRACEFIX_TRAINING_RECIPE": "sft+grpo", "TRACEFIX_TRAINING_MAX_NEW_TOKENS": "40"}
    config = TrainingSettings.model_validate(train_config(load_settings(path, environ=environ)))
    assert config.recipe == "sft+grpo" and config.new_tokens == 40 and config.dtype == "bfloat16"
    with pytest.raises(ConfigError, match="recipe"):
        load_settings(path, environ={"TRACEFIX_TRAINING_RECIPE": "sft", "TRACEFIX_TRAINING_WARM_START_EXAMPLES": "0"})