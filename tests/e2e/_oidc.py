"""The real OIDC provider process of the identity tests.

npm's ``oauth2-mock-server`` (pinned in ``tests/e2e/oidc/package.json``) serves
discovery, a JWKS with ``kid``s, the authorization code grant with PKCE and RS256 tokens;
``tests/e2e/oidc/provider.mjs`` runs it behind a few routes of ours on the same port:
the device authorization grant (it has none), refresh tokens that keep their user, key
rotation that signs with the newest key only (it round-robins), and ``/_test/*`` control
routes (sign a user in, mint a token for given claims, rotate, retire, count JWKS
fetches). :func:`install_provider` installs it from the npm registry (a missing npm or an
unreachable registry fails the test, saying which, as for the agents);
:func:`start_provider` runs ``node provider.mjs`` on a free port.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.e2e._npm import require_npm
from tests.e2e._procs import Proc, free_port, wait_ready

SOURCE = Path(__file__).resolve().parent / "oidc"
CLIENT_ID = "mayu-cli"  # the audience of the provider's ID tokens (their ``aud``)


def install_provider(prefix: Path) -> Path:
    """``provider.mjs`` with its pinned packages installed next to it, under ``prefix``."""
    npm = require_npm("oauth2-mock-server (the identity tests' OIDC provider)")
    for name in ("package.json", "provider.mjs"):
        shutil.copy(SOURCE / name, prefix / name)
    install = subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit",
                              "--no-fund", "--loglevel=error"],
                             capture_output=True, text=True, timeout=240, check=False)
    assert install.returncode == 0, f"npm install failed:\n{install.stderr[-2000:]}"
    return prefix / "provider.mjs"


@dataclass
class OidcProvider:
    """A running provider: its issuer URL and the test's handles on it."""

    proc: Proc

    @property
    def issuer(self) -> str:
        return self.proc.url

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = httpx.post(f"{self.issuer}{path}", json=body, timeout=10)
        r.raise_for_status()
        answer: dict[str, Any] = r.json()
        return answer

    def token(self, sub: str, *, email: str | None = None, groups: list[str] | None = None,
              aud: str = CLIENT_ID, expires_in: int = 3600,
              header: dict[str, Any] | None = None, **claims: Any) -> str:
        """A token signed by the provider's current key for these claims (``claims``
        override the defaults: ``iss``, ``iat``, ``nbf``, ``exp``)."""
        body = {"sub": sub, "email": email or f"{sub}@example.com", "groups": groups or [],
                "aud": aud, "expires_in": expires_in, "header": header or {}, **claims}
        return str(self._post("/_test/token", body)["token"])

    def sign_in(self, sub: str, *, email: str | None = None,
                groups: list[str] | None = None) -> None:
        """The user whom the next authorization or device approval signs in."""
        self._post("/_test/user", {"sub": sub, "email": email or f"{sub}@example.com",
                                   "groups": groups or []})

    def rotate(self) -> tuple[str, str]:
        """A new signing key: (new kid, previous kid); the previous stays published."""
        answer = self._post("/_test/rotate", {})
        return str(answer["kid"]), str(answer["previous"])

    def retire(self, kid: str) -> None:
        """Removes ``kid`` from the JWKS."""
        self._post("/_test/retire", {"kid": kid})

    def jwks_fetches(self) -> int:
        """How many times the JWKS was fetched since the provider started."""
        return int(httpx.get(f"{self.issuer}/_test/stats", timeout=10).json()["jwks"])

    def stop(self) -> None:
        self.proc.stop()


def start_provider(script: Path, workdir: Path, *, deadline_s: float = 60.0) -> OidcProvider:
    """``node provider.mjs`` on a free port, once it answers ``/readyz``."""
    port = free_port()
    log_path = workdir / f"oidc-{port}.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(["node", str(script), str(port)], stdout=log,
                                 stderr=subprocess.STDOUT, cwd=str(script.parent))
    proc = wait_ready(Proc(popen=popen, port=port, log_path=log_path), deadline_s=deadline_s)
    return OidcProvider(proc)
