"""The azure and vertex kinds without I/O: their URLs and bodies, start-up errors naming
the bad key, the docs' config blocks, and the Vertex ids in the catalog."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from gateway.catalog import builtin_catalog
from gateway.config import AzureCredentials, GcpCredentials, ProviderSettings, load_settings
from gateway.errors import BadRequest, ConfigError
from gateway.ingress._vertex import messages_body
from gateway.providers import build_providers
from gateway.providers._azure import AzureProvider
from gateway.providers._vertex import VertexProvider

DOCS = Path(__file__).resolve().parents[2] / "docs"
VERTEX_BASE = "https://us-east5-aiplatform.googleapis.com/v1/projects/p/locations/us-east5"


def _azure(base: str, version: str | None = None) -> AzureProvider:
    return AzureProvider(ProviderSettings(name="az", kind="azure", base_url=base,
                                          api_version=version, api_key_ref="env:K"))


def test_azure_paths_of_both_forms() -> None:
    """v1: OpenAI's paths; deployment form: the body's model as the deployment, with the
    api-version; Responses stays /responses."""
    body = b'{"model": "my dep", "messages": []}'
    v1 = _azure("https://r.openai.azure.com/openai/v1")
    assert v1._request("chat", body) == ("/chat/completions", body)
    dep = _azure("https://r.openai.azure.com/openai", "2024-10-21")
    assert dep._request("chat", body)[0] == (
        "/deployments/my%20dep/chat/completions?api-version=2024-10-21")
    assert dep._request("embeddings", body)[0].startswith("/deployments/my%20dep/embed")
    assert dep._request("responses", body)[0] == "/responses?api-version=2024-10-21"


@pytest.mark.parametrize(("base", "version", "key"), [
    ("https://r.openai.azure.com/v1", None, "base_url"),
    ("https://r.openai.azure.com/openai", None, "api_version")])
def test_azure_config_errors_name_the_key(base: str, version: str | None, key: str) -> None:
    """A base_url of neither form, or the deployment form without api_version: a start-up
    error naming the key."""
    with pytest.raises(ConfigError, match=rf"providers\[0\]\.{key}"):
        _azure(base, version)


def test_vertex_request_moves_the_model_into_the_path() -> None:
    """The model goes into the path, anthropic_version vertex-2023-10-16 into the body;
    a stream uses streamRawPredict."""
    vertex = VertexProvider(ProviderSettings(name="v", kind="vertex", base_url=VERTEX_BASE,
                                             api_key_ref="env:T"))
    path, sent = vertex._request("messages", b'{"model": "claude-x@1", "stream": true}')
    assert path == "/publishers/anthropic/models/claude-x@1:streamRawPredict"
    assert msgspec.json.decode(sent) == {"stream": True,
                                         "anthropic_version": "vertex-2023-10-16"}
    assert vertex._request("messages", b'{"model": "m"}')[0].endswith("/m:rawPredict")
    with pytest.raises(ConfigError, match=r"providers\[0\]\.base_url"):
        VertexProvider(ProviderSettings(name="v", kind="vertex", api_key_ref="env:T",
                                        base_url="https://aiplatform.googleapis.com/v1"))


def test_vertex_ingress_body_becomes_a_messages_body() -> None:
    """The path's model is put in, anthropic_version dropped, a model in the body or a
    non-string version refused."""
    doc = {"anthropic_version": "vertex-2023-10-16", "max_tokens": 5, "messages": []}
    assert msgspec.json.decode(messages_body(dict(doc), model="m", stream=True)) == {
        "model": "m", "max_tokens": 5, "messages": [], "stream": True}
    with pytest.raises(BadRequest, match="model"):
        messages_body({**doc, "model": "m"}, model="m", stream=False)
    with pytest.raises(BadRequest, match="anthropic_version"):
        messages_body({**doc, "anthropic_version": 1}, model="m", stream=False)


def test_vertex_ids_are_catalog_snapshots() -> None:
    """Vertex's model ids resolve to their Anthropic entries (list prices)."""
    catalog = builtin_catalog()
    for vertex_id, model in (("claude-opus-4-5@20251101", "claude-opus-4-5"),
                             ("claude-haiku-4-5@20251001", "claude-haiku-4-5")):
        entry = catalog.get(vertex_id)
        assert entry is not None and entry.id == model


@pytest.mark.parametrize("page", ["vertex.md", "azure.md"])
def test_docs_config_blocks_load_and_build(page: str, tmp_path: Path) -> None:
    """Each YAML block of the page is a valid config whose providers build (a key file
    it names stood in for by an empty one here)."""
    blocks = re.findall(r"```yaml\n(.*?)```", (DOCS / page).read_text(), re.S)
    assert blocks
    key_file = tmp_path / "sa.json"
    key_file.write_text("{}")
    for i, block in enumerate(blocks):
        path = tmp_path / f"{i}.yaml"
        path.write_text(re.sub(r"(service_account_file: )[^,}\s]+", rf"\g<1>{key_file}",
                               block))
        settings = load_settings(path)
        assert set(build_providers(settings.providers)) == {p.name for p in
                                                            settings.providers}


def test_credential_mistakes_are_start_up_errors_naming_the_key(tmp_path: Path) -> None:
    """A missing service-account file, or a client secret without tenant_id: start-up
    errors naming the credentials key, before any token is asked for."""
    with pytest.raises(ConfigError,
                       match=r"providers\[0\]\.credentials\.service_account_file"):
        VertexProvider(ProviderSettings(
            name="v", kind="vertex", base_url=VERTEX_BASE,
            credentials=GcpCredentials(service_account_file=str(tmp_path / "none.json"))))
    with pytest.raises(ConfigError, match=r"providers\[0\]\.credentials\.tenant_id"):
        AzureProvider(ProviderSettings(
            name="a", kind="azure", base_url="https://r.openai.azure.com/openai/v1",
            credentials=AzureCredentials(client_id="c", client_secret_ref="env:S")))
