"""Gateway configuration: typed settings, loading with path-named errors, secret refs."""

from gateway.config._load import (
    DEFAULT_MOCK_MODELS,
    decode_yaml_file,
    load_settings,
    resolve_secret,
)
from gateway.config._settings import (
    BootstrapTeam,
    ControlPlaneSettings,
    DatabaseSettings,
    Deployment,
    GovernanceStoreSettings,
    KeyStoreSettings,
    ModelSettings,
    ProviderSettings,
    ServerSettings,
    Settings,
)

__all__ = [
    "DEFAULT_MOCK_MODELS",
    "BootstrapTeam",
    "ControlPlaneSettings",
    "DatabaseSettings",
    "Deployment",
    "GovernanceStoreSettings",
    "KeyStoreSettings",
    "ModelSettings",
    "ProviderSettings",
    "ServerSettings",
    "Settings",
    "decode_yaml_file",
    "load_settings",
    "resolve_secret",
]
