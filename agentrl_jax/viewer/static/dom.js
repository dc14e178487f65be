/* agentrl-jax viewer: the page's safety core, loaded before app.js. Everything from a run folder
   is data, never markup: HTML is only ever built with the html`` tag, which escapes every value
   put into it (unless the value is itself html``), and only setHtml() puts it into the page;
   plain text goes in through textContent. api() talks to server.py with the API key, if the
   user gave one (kept in sessionStorage); in an export file (export.py) the data comes from the
   JSON block #viewer-export instead. */
"use strict";
const EXPORT_BLOCK = document.getElementById("viewer-export");
const EXPORT = EXPORT_BLOCK ? JSON.parse(EXPORT_BLOCK.textContent) : null;
const KEY_STORE = "viewer.apiKey";

// ------------------------------------------------------------------ helpers
/* The one escape: text -> HTML text or attribute value (quoted attributes only). */
function esc(s) {
  return String(s == null ? "" : s).replace(/[&<>"'`]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;", "`": "&#96;"}[c]));
}
/* HTML built by html``: the only kind of value inserted without escaping. */
class Html {
  constructor(text) { this.text = text; }
  toString() { return this.text; }
}
function htmlOf(v) {
  if (v instanceof Html) return v.text;
  if (Array.isArray(v)) return v.map(htmlOf).join("");
  return esc(v);
}
/* Tagged template: html`<td>${value}</td>` escapes value (arrays: each item, concatenated). */
function html(strings, ...values) {
  let out = strings[0];
  for (let i = 0; i < values.length; i++) out += htmlOf(values[i]) + strings[i + 1];
  return new Html(out);
}
function setHtml(el, h) {
  if (!(h instanceof Html)) throw new TypeError("setHtml() takes html`` only");
  el.innerHTML = h.text;
}
function fmt(x, d = 3) {
  if (x == null || x === "") return "";
  if (typeof x !== "number") return String(x);
  if (Number.isInteger(x)) return String(x);
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return x.toExponential(2);
  return x.toFixed(d);
}
function pct(x) { return x == null ? "–" : (100 * x).toFixed(1) + "%"; }
function $(sel, root = document) { return root.querySelector(sel); }
function $$(sel, root = document) { return Array.from(root.querySelectorAll(sel)); }

class NeedKey extends Error {}
function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORE);
  return key ? {Authorization: "Bearer " + key} : {};
}
function apiUrl(path, params = {}) {
  const qs = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") qs.set(k, v);
  return path + (qs.toString() ? "?" + qs : "");
}
async function api(path, params = {}) {
  if (EXPORT) throw new Error("no server in an exported file");
  const r = await fetch(apiUrl(path, params), {headers: authHeaders()});
  let body;
  try { body = await r.json(); } catch (e) { throw new Error(`${path}: ${r.status} ${r.statusText}`); }
  if (r.status === 401) throw new NeedKey(String(body.error || "this viewer needs its API key"));
  if (!r.ok) throw new Error(String(body.error || r.statusText));
  return body;
}
/* Download /api/export (with the key) as a file. */
async function downloadExport(params) {
  const r = await fetch(apiUrl("/api/export", params), {headers: authHeaders()});
  if (!r.ok) { let m = r.statusText; try { m = (await r.json()).error || m; } catch (e) { /* keep */ } throw new Error(String(m)); }
  const name = (/filename="([^"]+)"/.exec(r.headers.get("Content-Disposition") || "") || [])[1] || "episodes.html";
  const a = document.createElement("a");
  a.href = URL.createObjectURL(await r.blob());
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 60000);
}
function showKeyForm(el, message) {
  setHtml(el, html`<form class="card" id="key-form"><p>${message}</p>
    <label>API key <input type="password" id="api-key" autocomplete="off"></label> <button>open</button></form>`);
  $("#key-form", el).addEventListener("submit", e => {
    e.preventDefault();
    sessionStorage.setItem(KEY_STORE, $("#api-key", el).value);
    render();
  });
}
