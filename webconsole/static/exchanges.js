// The Exchanges panel: the group's exchanges and their bindings, read when the page opens and
// after each change; an admin declares, binds, unbinds and deletes (the admin REST API).
// Uses app.js's api(), el(), say() and session.

function bindingText(b) {
  const args = Object.entries(b.arguments).map(([k, v]) => `${k}=${v}`).join(" ");
  return `${b.to_exchange ? "exchange" : "queue"} ${b.destination}` + (b.routing_key ? ` (${b.routing_key})` : "") +
    (args ? ` [${args}]` : "");
}

async function loadExchanges() {
  let list;
  try { list = await api("GET", "/api/v1/exchanges"); } catch (e) { say(e.message, true); return; }
  const body = document.querySelector("#exchanges tbody");
  body.replaceChildren(...list.map((x) => el("tr", {"data-exchange": x.name},
    el("td", {}, x.name), el("td", {}, x.type), el("td", {}, x.alternate || ""),
    el("td", {}, ...x.bindings.map((b) => el("div", {},
      bindingText(b), " ", el("button", {class: "admin-only", onclick: () => unbind(x.name, b)}, "unbind")))),
    el("td", {class: "admin-only"}, el("button", {onclick: () => deleteExchange(x.name)}, "delete")))));
  if (!list.length) body.replaceChildren(el("tr", {}, el("td", {colSpan: 5}, "(no exchanges)")));
}

async function change(what, fn) {
  try { await fn(); say(what); } catch (e) { say(e.message, true); }
  await loadExchanges();
}

function unbind(source, b) {
  if (!confirm(`Unbind ${bindingText(b)} from exchange ${source}?`)) return;
  change(`unbound ${b.destination} from ${source}`, () => api("POST",
    `/api/v1/exchanges/${encodeURIComponent(source)}/unbind`,
    {destination: b.destination, to_exchange: b.to_exchange, routing_key: b.routing_key, arguments: b.arguments}));
}

function deleteExchange(name) {
  if (!confirm(`Delete exchange ${name} and its bindings?`)) return;
  change(`deleted exchange ${name}`, () => api("DELETE", `/api/v1/exchanges/${encodeURIComponent(name)}`));
}

document.getElementById("create-exchange").onsubmit = (ev) => {
  ev.preventDefault();
  const name = document.getElementById("new-exchange-name").value.trim();
  const body = {name, type: document.getElementById("new-exchange-type").value};
  const alternate = document.getElementById("new-exchange-alternate").value.trim();
  if (alternate) body.alternate = alternate;
  change(`declared exchange ${name}`, () => api("POST", "/api/v1/exchanges", body));
};

document.getElementById("bind-queue").onsubmit = (ev) => {
  ev.preventDefault();
  const source = document.getElementById("bind-exchange").value.trim();
  const destination = document.getElementById("bind-queue-name").value.trim();
  const routing_key = document.getElementById("bind-key").value;
  change(`bound ${destination} to ${source}`, () => api("POST",
    `/api/v1/exchanges/${encodeURIComponent(source)}/bindings`, {destination, routing_key}));
};

loadExchanges();
