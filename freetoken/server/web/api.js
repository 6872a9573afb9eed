// Talking to this server: every call carries the API key (asked once, kept in sessionStorage)
// as a Bearer token; a 401 asks for it again and retries. The admin token, for /admin/ routes,
// is a second secret kept the same way.
"use strict";

const FT = window.FT = {};

FT.secrets = {
  api: { store: "freetoken.apiKey", label: "API key", why: "This server needs an API key (serve --api-key)." },
  admin: { store: "freetoken.adminToken", label: "Admin token", why: "Resizing needs the admin token (serve --admin-token)." },
};

FT.secret = (kind) => sessionStorage.getItem(FT.secrets[kind].store) || "";

// Ask for a secret in the page's dialog; resolves true when one was given.
FT.askSecret = (kind, wrong) => new Promise((resolve) => {
  const d = document.getElementById("key-dialog");
  const input = document.getElementById("key-input");
  const s = FT.secrets[kind];
  document.getElementById("key-label").textContent = s.label;
  document.getElementById("key-why").textContent = (wrong ? "That was refused. " : "") + s.why;
  input.value = "";
  const done = (ok) => {
    d.close();
    if (ok && input.value) sessionStorage.setItem(s.store, input.value);
    resolve(ok && !!input.value);
  };
  document.getElementById("key-form").onsubmit = (e) => { e.preventDefault(); done(true); };
  document.getElementById("key-cancel").onclick = () => done(false);
  d.oncancel = (e) => { e.preventDefault(); done(false); };   // Escape
  d.showModal();
  input.focus();
});

FT.pending = null;   // one dialog at a time: concurrent 401s wait for the same answer

// fetch() with the secret; on 401 ask for it (once for all callers) and retry.
FT.fetch = async (path, opts = {}, kind = "api") => {
  for (let attempt = 0; ; attempt++) {
    const headers = new Headers(opts.headers || {});
    const key = FT.secret(kind);
    if (key) headers.set("Authorization", "Bearer " + key);
    const r = await fetch(path, { ...opts, headers });
    if (r.status !== 401 || attempt > 2) return r;
    if (!FT.pending) {
      FT.pending = FT.askSecret(kind, !!key).finally(() => { FT.pending = null; });
    }
    if (!(await FT.pending)) return r;
  }
};

FT.json = async (path, opts = {}, kind = "api") => {
  const r = await FT.fetch(path, opts, kind);
  let body = null;
  try { body = await r.json(); } catch (e) { /* not JSON */ }
  if (!r.ok) {
    const msg = (body && body.error && (body.error.message || body.error)) || r.statusText;
    throw new Error(`${r.status}: ${typeof msg === "string" ? msg : JSON.stringify(msg)}`);
  }
  return body;
};

FT.postJSON = (path, body, kind = "api", signal) => FT.fetch(path, {
  method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal,
}, kind);

// Prometheus text exposition -> {name: [{labels: {...}, value: Number}]}
FT.parseMetrics = (text) => {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    if (m[3]) {
      for (const lm of m[3].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[lm[1]] = lm[2];
    }
    (out[m[1]] = out[m[1]] || []).push({ labels, value: Number(m[4]) });
  }
  return out;
};

FT.fmt = (v) => {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (Number.isInteger(v)) return v.toLocaleString("en-US");
  const a = Math.abs(v);
  return a >= 100 ? v.toFixed(1) : a >= 1 ? v.toFixed(2) : v.toPrecision(3);
};

FT.bytes = (n) => {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(2) : String(n)) + " " + units[i];
};

FT.el = (tag, cls, text) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
};

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("key-button").onclick = () => FT.askSecret("api", false);
});
