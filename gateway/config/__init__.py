"""Gateway configuration: typed settings, loading with path-named errors, secret refs."""

from gateway.config._load import (
    DEFAULT_MOCK_MODELS,
    check_secrets,
    decode_yaml_file,
    is_reference,
    load_settings,
    load_settings_and_models,
    resolve_secret,
    secret_refs,
)
from gateway.config._models import FIGURES, ModelFigures
from gateway.config._ranges import (
    MAX_SECONDS,
    Bytes,
    PoolSize,
    Port,
    Seconds,
    SecondsOrZero,
)
from gateway.config._settings import (
    AlertSettings,
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
    "AlertSettings",
    "DEFAULT_MOCK_MODELS",
    "FIGURES",
    "MAX_SECONDS",
    "BootstrapTeam",
    "Bytes",
    "ControlPlaneSettings",
    "DatabaseSettings",
    "Deployment",
    "GovernanceStoreSettings",
    "KeyStoreSettings",
    "ModelFigures",
    "ModelSettings",
    "PoolSize",
    "Port",
    "ProviderSettings",
    "Seconds",
    "SecondsOrZero",
    "ServerSettings",
    "Settings",
    "check_secrets",
    "decode_yaml_file",
    "is_reference",
    "load_settings",
    "load_settings_and_models",
    "resolve_secret",
    "secret_refs",
]
