"""Loading settings: local defaults, and errors that name the bad key path."""

from __future__ import annotations

import pytest

from gateway.config import DEFAULT_MOCK_MODELS, load_settings, resolve_secret
from gateway.errors import ConfigError


def write(tmp_path, text: str):
    path = tmp_path / "mayu.yaml"
    path.write_text(text)
    return path


def test_no_config_is_the_local_profile_with_mock_models():
    """With no file the gateway runs offline: local stores, the mock provider, demo on."""
    s = load_settings(None)
    assert (s.key_store.type, s.governance_store.type, s.shared) == ("sqlite", "local",
                                                                     False)
    assert [m.name for m in s.models] == list(DEFAULT_MOCK_MODELS)
    assert [p.kind for p in s.providers] == ["mock"] and s.demo and s.data_dir == ".mayu"


def test_empty_file_is_the_same_as_no_file(tmp_path):
    """An empty YAML file decodes to the defaults."""
    assert load_settings(write(tmp_path, "")) == load_settings(None)


def test_configured_models_replace_the_mock_defaults(tmp_path):
    """Once providers/models are configured, no mock model is added behind them."""
    s = load_settings(write(tmp_path, """
providers: [{name: up, kind: openai, base_url: "http://127.0.0.1:9"}]
models:
  - name: gpt
    deployments: [{provider: up, upstream_model: gpt-4o}]
    price: {input: 150000, output: 600000}
"""))
    assert [m.name for m in s.models] == ["gpt"]
    assert s.models[0].price.output == 600_000


@pytest.mark.parametrize(("text", "path"), [
    ("server:\n  port: high\n", "server.port"),
    ("server:\n  prot: 1\n", "server"),
    ("key_store:\n  type: redis\n", "key_store.type"),
    ("providers: [{name: a, kind: openai}]\n", "providers[0].base_url"),
    ("providers: [{name: a, kind: mock}, {name: a, kind: mock}]\n", "providers[1].name"),
    ("providers: [{name: a, kind: mock}]\nmodels: [{name: m, deployments: []}]\n",
     "models[0].deployments"),
    ("providers: [{name: a, kind: mock}]\n"
     "models: [{name: m, deployments: [{provider: b}]}]\n", "models[0].deployments[0].provider"),
    ("providers: [{name: a, kind: mock}]\n"
     "models: [{name: m, deployments: [{provider: a}], price: {input: -1}}]\n",
     "models[0].price.input"),
    ("providers: [{name: a, kind: mock}]\n"
     "models: [{name: m, deployments: [{provider: a}], max_output_tokens: 0}]\n",
     "models[0].max_output_tokens"),
    ("policies: [p.yaml]\ncontrol_plane: {url: 'http://cp'}\n", "policies"),
    ("key_store: {type: postgres}\n", "governance_store.type"),
    ("key_store: {type: postgres}\ngovernance_store: {type: postgres}\n", "database"),
    ("key_store: {type: postgres}\ngovernance_store: {type: postgres, journal: true}\n"
     "database: {}\n", "governance_store.journal"),
    ("server:\n  max_body_bytes: 0\n", "server.max_body_bytes"),
])
def test_errors_name_the_key_path(tmp_path, text, path):
    """Every invalid setting fails with a ConfigError that starts with its key path."""
    file = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_settings(file)
    # Decoding errors lead with the file, then the key path; checks lead with the path.
    message = info.value.message.removeprefix(f"{file}: ")
    assert message.startswith(path), message


def test_unreadable_and_malformed_files_are_config_errors(tmp_path):
    """A missing file or invalid YAML is a ConfigError naming the file."""
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(write(tmp_path, "server: [\n"))


def test_secrets_resolve_from_env_and_file_and_refuse_inline(tmp_path, monkeypatch):
    """env: and file: references resolve; an inline value is refused naming the key."""
    monkeypatch.setenv("B_TEST_SECRET", "s3cret")
    assert resolve_secret("env:B_TEST_SECRET", key="x") == "s3cret"
    (tmp_path / "tok").write_text("from-file\n")
    assert resolve_secret(f"file:{tmp_path / 'tok'}", key="x") == "from-file"
    with pytest.raises(ConfigError, match="providers\\[0\\].api_key_ref: environment"):
        resolve_secret("env:B_TEST_UNSET_VARIABLE", key="providers[0].api_key_ref")
    with pytest.raises(ConfigError, match="never inline"):
        resolve_secret("sk-live-123", key="providers[0].api_key_ref")


def test_control_plane_selects_the_lease_profile_with_local_stores_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """control_plane is accepted with local stores (the lease profile) and refused, naming
    the key, with policies files or a Postgres governance store."""
    path = tmp_path / "cp.yaml"
    path.write_text("control_plane: {url: 'http://cp:8080', token_ref: 'env:T'}\n")
    settings = load_settings(path)
    assert settings.control_plane is not None and not settings.shared
    path.write_text("control_plane: {url: 'http://cp:8080'}\npolicies: [p.yaml]\n")
    with pytest.raises(ConfigError, match="^policies: mutually exclusive with control_plane"):
        load_settings(path)
    path.write_text("control_plane: {url: 'http://cp:8080'}\n"
                    "key_store: {type: postgres}\ngovernance_store: {type: postgres}\n"
                    "database: {dsn_ref: 'env:X'}\n")
    with pytest.raises(ConfigError, match="^control_plane: the lease profile needs"):
        load_settings(path)
