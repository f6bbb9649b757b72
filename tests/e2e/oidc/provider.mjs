// The OIDC provider process of the identity tests (tests/e2e/_oidc.py starts it).
//
// npm's oauth2-mock-server serves discovery, a JWKS with kids, the authorization code
// grant with PKCE and signs RS256 tokens. What it lacks, this wrapper adds in front of
// it, on the same port:
//  - the device authorization grant (RFC 8628): /device_authorization, a verification
//    page (/device?user_code=...) that approves as the signed-in user, and the
//    device_code grant at /token;
//  - users: every token carries the claims of the user signed in when it was granted
//    (POST /_test/user), and a refresh token keeps its user;
//  - key rotation: POST /_test/rotate makes a new key the signer (the old one stays
//    published until POST /_test/retire removes it), where the mock round-robins keys;
//  - POST /_test/token mints a token for given claims (a test's forged or expired one);
//  - GET /_test/stats counts JWKS fetches (a verifier's refresh rate is observable).
// Usage: node provider.mjs <port>   (prints "ready <issuer>" once listening)

import { randomBytes, randomUUID } from "node:crypto";
import express from "express";
import { OAuth2Server } from "oauth2-mock-server";

const port = Number(process.argv[2] ?? 0);
const server = new OAuth2Server();
const issuer = server.issuer;
const service = server.service;
let currentKid = (await issuer.keys.generate("RS256")).kid;
const retired = new Set();
const stats = { jwks: 0 };

// The mock picks keys round-robin; a rotated provider signs with its newest key only.
const pickKey = issuer.keys.get.bind(issuer.keys);
issuer.keys.get = (kid) => pickKey(kid ?? currentKid);

let signedIn = { sub: "user-1", email: "user1@example.com", groups: [] };
const byCode = new Map();      // authorization code -> user
const byRefresh = new Map();   // refresh token -> user
const devices = new Map();     // device_code -> { userCode, user | null, clientId }
const TTL = 3600;

const userClaims = (user) => ({ sub: user.sub, email: user.email, groups: user.groups });

service.on("beforeAuthorizeRedirect", (redirect) => {
  const code = redirect.url.searchParams.get("code");
  if (code) byCode.set(code, signedIn);
});
service.on("beforeTokenSigning", (token, req) => {
  const user = byCode.get(req.body?.code);
  if (user) Object.assign(token.payload, userClaims(user));
});
service.on("beforeResponse", (response, req) => {
  const user = byCode.get(req.body?.code);
  if (user && response.body.refresh_token) byRefresh.set(response.body.refresh_token, user);
});

async function grant(user, clientId, scope) {
  const claims = (_h, payload) => Object.assign(payload, userClaims(user), { scope });
  const idClaims = (_h, payload) => Object.assign(payload, userClaims(user), { aud: clientId });
  const refresh = randomBytes(32).toString("base64url");
  byRefresh.set(refresh, user);
  return {
    access_token: await issuer.buildToken({ scopesOrTransform: claims, expiresIn: TTL }),
    id_token: await issuer.buildToken({ scopesOrTransform: idClaims, expiresIn: TTL }),
    refresh_token: refresh, token_type: "Bearer", expires_in: TTL, scope,
  };
}

const app = express();
app.disable("x-powered-by");
const form = express.urlencoded({ extended: false });

app.get("/.well-known/openid-configuration", (_req, res) => {
  const base = issuer.url;
  res.json({
    issuer: base,
    authorization_endpoint: `${base}/authorize`,
    token_endpoint: `${base}/token`,
    device_authorization_endpoint: `${base}/device_authorization`,
    jwks_uri: `${base}/jwks`,
    userinfo_endpoint: `${base}/userinfo`,
    response_types_supported: ["code"],
    grant_types_supported: ["authorization_code", "refresh_token",
      "urn:ietf:params:oauth:grant-type:device_code"],
    id_token_signing_alg_values_supported: ["RS256"],
    subject_types_supported: ["public"],
    token_endpoint_auth_methods_supported: ["none"],
    code_challenge_methods_supported: ["S256"],
  });
});
app.get("/jwks", (_req, res) => {
  stats.jwks += 1;
  res.json({ keys: issuer.keys.toJSON().filter((k) => !retired.has(k.kid)) });
});
app.post("/device_authorization", form, (req, res) => {
  const deviceCode = randomBytes(24).toString("base64url");
  const userCode = randomBytes(4).toString("hex").toUpperCase();
  devices.set(deviceCode, { userCode, user: null, clientId: req.body.client_id,
    scope: req.body.scope ?? "openid" });
  const uri = `${issuer.url}/device`;
  res.json({ device_code: deviceCode, user_code: userCode, verification_uri: uri,
    verification_uri_complete: `${uri}?user_code=${userCode}`, expires_in: 600, interval: 1 });
});
app.get("/device", (req, res) => {
  for (const device of devices.values()) {
    if (device.userCode === req.query.user_code) {
      device.user = signedIn;
      res.type("html").send(`<p>Signed in as ${signedIn.email}; you may close this page.</p>`);
      return;
    }
  }
  res.status(404).type("html").send("<p>Unknown code.</p>");
});
app.post("/token", form, async (req, res, next) => {
  const body = req.body;
  res.set({ "Cache-Control": "no-store" });
  if (body.grant_type === "urn:ietf:params:oauth:grant-type:device_code") {
    const device = devices.get(body.device_code);
    if (!device) return res.status(400).json({ error: "expired_token" });
    if (!device.user) return res.status(400).json({ error: "authorization_pending" });
    devices.delete(body.device_code);
    return res.json(await grant(device.user, device.clientId, device.scope));
  }
  if (body.grant_type === "refresh_token") {
    const user = byRefresh.get(body.refresh_token);
    if (!user) return res.status(400).json({ error: "invalid_grant" });
    byRefresh.delete(body.refresh_token);
    return res.json(await grant(user, body.client_id, body.scope ?? "openid"));
  }
  return next();
});

app.use("/_test", express.json());
app.post("/_test/user", (req, res) => {
  signedIn = { sub: req.body.sub, email: req.body.email, groups: req.body.groups ?? [] };
  res.json(signedIn);
});
app.post("/_test/token", async (req, res) => {
  const { header = {}, expires_in: expiresIn = TTL, ...claims } = req.body;
  const token = await issuer.buildToken({
    expiresIn,
    scopesOrTransform: (h, payload) => { Object.assign(h, header); Object.assign(payload, claims); },
  });
  res.json({ token });
});
app.post("/_test/rotate", async (_req, res) => {
  const previous = currentKid;
  currentKid = (await issuer.keys.generate("RS256")).kid;
  res.json({ kid: currentKid, previous });
});
app.post("/_test/retire", (req, res) => {
  retired.add(req.body.kid);
  res.json({ retired: [...retired] });
});
app.get("/readyz", (_req, res) => res.json({ ready: true }));  // as tests/e2e/_procs.py polls
app.get("/_test/stats", (_req, res) => res.json({ ...stats, kid: currentKid }));
app.use(service.requestHandler);

const listener = app.listen(port, "127.0.0.1", () => {
  issuer.url = `http://127.0.0.1:${listener.address().port}`;
  console.log(`ready ${issuer.url}`);
});
for (const signal of ["SIGTERM", "SIGINT"]) process.on(signal, () => listener.close(() => process.exit(0)));
