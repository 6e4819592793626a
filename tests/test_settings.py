"""Configuration: the embedded config.toml, --config files and TRACEFIX_<SECTION>_<KEY> variables."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from daemon.core.settings import ConfigError, Settings, load_settings

REPO = Path(__file__).resolve().parent.parent


def test_embedded_config_is_valid_and_matches_the_model_defaults() -> None:
    settings = load_settings(environ={})
    assert settings.collector.http_port == 4318
    assert settings.collector.grpc_port == 4317
    assert settings.api.port == 8700
    assert settings.collector.host == "127.0.0.1"
    # Every key of config.toml is a field of the model (extra keys are forbidden), and vice versa.
    shipped = tomllib.loads((REPO / "config.toml").read_text())
    assert set(Settings.model_fields) == set(shipped)
    for section, values in shipped.items():
        assert set(values) <= set(type(getattr(settings, section)).model_fields), section


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


def test_gpu_settings_reach_the_training_config_from_the_file_and_the_environment(tmp_path: Path) -> None:
    from daemon.pipeline.training_job import train_config
    from trainer.grpo import TrainConfig

    path = tmp_path / "gpu.toml"
    path.write_text("[training]\ngrpo_args = { bf16 = true }\nlora_dropout = 0.05\n")
    config = TrainConfig.from_dict(train_config(load_settings(path, environ={})))
    assert config.grpo_args == {"bf16": True} and config.lora_dropout == 0.05
    environ = {"TRACEFIX_TRAINING_GRPO_ARGS": '{"use_vllm": true, "vllm_mode": "colocate"}'}
    merged = TrainConfig.from_dict(train_config(load_settings(path, environ=environ))).grpo_args
    assert merged == {"bf16": True, "use_vllm": True, "vllm_mode": "colocate"}  # tables merge, as the file's do
