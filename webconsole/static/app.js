// The Tandem console: one page kept live by the node's event stream (Server-Sent Events).
// Changes go to the admin API with the session's CSRF token; users without the admin
// permission (monitors) see no forms.
"use strict";
let session = null;
let lastOverview = null;
let selectedQueue = null;
const history = new Map();  // queue -> [{depth, pub, ack}], one sample a second, two minutes

async function api(method, path, body) {
  const headers = {"Content-Type": "application/json", "X-Tandem-Console": "1"};
  if (session && session.csrf) headers["X-CSRF-Token"] = session.csrf;
  const resp = await fetch(path, {method, headers, credentials: "same-origin",
                                  body: body === undefined ? undefined : JSON.stringify(body)});
  if (resp.status === 401) { window.location = "/login"; throw new Error("not logged in"); }
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new Error(data.message || resp.statusText);
  return data;
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("data-")) e.setAttribute(k, v); else e[k] = v;
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function say(text, bad) {
  const r = document.getElementById("result");
  r.textContent = text;
  r.className = bad ? "error" : "";
}

function renderNodes(nodes, group) {
  const change = document.getElementById("group-change");
  change.hidden = !group.group_change;
  change.textContent = group.group_change ? `group change under way: ${group.group_change}` : "";
  const updating = document.getElementById("updating");
  const ups = group.updating || [];
  updating.hidden = !ups.length;
  updating.textContent = ups.length ? "queues being updated (re-mapping): " + ups.map((u) => {
    const [q, parts] = u.split(" ");
    return `${q}, partitions ${parts} left`;
  }).join("; ") : "";
  const box = document.getElementById("nodes");
  box.replaceChildren(...nodes.map((n) => el("div", {class: `card ${n.state}`, "data-node": n.name},
    el("h3", {}, n.name + (n.self ? " (this node)" : "")),
    el("div", {}, "state ", el("span", {class: "state"}, n.state)),
    el("div", {}, `priority ${n.priority ?? "?"}, votes ${n.votes ?? "?"}` + (n.zone ? `, zone ${n.zone}` : "")),
    ...(n.drained ? [el("div", {class: "drained"}, "drained: active for nothing while another member can be")] : []),
    el("div", {}, `quorum ${n.quorum_state ?? "?"}`),
    ...(n.availability_zones || []).map((z) => el("div", {class: `zone ${z.state}`},
      `availability zone ${z.name}: ${z.state} (${z.up_votes} of ${z.total_votes} votes up, ${z.policy})` +
      (z.state === "Disabled" ? ": HA services off" : ""))),
    el("div", {}, `client ${n.client_address || "?"}`),
    el("div", {class: "build"}, `build ${n.version ?? "?"}`),
    ...haLines(n),
    el("div", {class: "actives"}, activesText(n, group)))));
  for (const id of ["override-node", "priority-node", "drain-node"]) {
    const sel = document.getElementById(id);
    const keep = sel.value;
    sel.replaceChildren(...nodes.map((n) => el("option", {value: n.name}, n.name)));
    if (keep) sel.value = keep;
  }
}

// A member's HA arbiter (shared mode, the LockFile arbiter): nothing under majority elections.
function haLines(n) {
  if (!n.ha_state) return [];
  return [el("div", {class: "ha"}, "HA ", el("span", {class: `ha-state ${n.ha_state}`}, n.ha_state),
             `, epoch ${n.epoch}`),
          el("div", {class: "holder"}, `lock holder ${n.lock_holder || "none"}`)];
}

// Shared mode has no per-partition actives: the lock holder serves every queue.
function activesText(n, group) {
  if (group.mode === "shared") return n.ha_state === "ACTIVE" ? "active for every queue" : "serves no queue";
  return `active for ${n.actives.length}: ${n.actives.join(", ") || "-"}`;
}

// How the group decides its active: the mode, the arbiter, the lock or lease holder and its epoch.
function modeText(g) {
  if (g.mode === "single") return "single node";
  const holder = g.lock_holder ? `${g.lock_holder} (epoch ${g.epoch})` : "none";
  if (g.mode === "shared") return `shared · lease holder ${holder}`;
  if (g.arbiter === "lockfile") return `replicated · LockFile · holder ${holder}`;
  if (g.arbiter === "witness") return "replicated · witness";
  return "replicated · majority elections";
}

// Shared mode: only the lock holder holds the queues; a passive's page points to its console.
function renderQueuesHint(o) {
  const hint = document.getElementById("queues-hint");
  const me = o.nodes.find((n) => n.self);
  const passive = o.group.mode === "shared" && me && me.ha_state && me.ha_state !== "ACTIVE";
  hint.hidden = !passive;
  if (!passive) return;
  const holder = o.nodes.find((n) => n.name === o.group.lock_holder);
  const link = holder && holder.console ? el("a", {href: holder.console}, `${holder.name}'s console`) : null;
  hint.replaceChildren(`${me.name} is ${me.ha_state}: the queues are served by the lock holder, ` +
                       `${o.group.lock_holder || "none at the moment"}`, ...(link ? [" (", link, ")"] : []), ".");
}

function renderQueues(queues) {
  const body = document.querySelector("#queues tbody");
  for (const q of queues) {
    if (!history.has(q.name)) history.set(q.name, []);
    const h = history.get(q.name);
    h.push({depth: q.depth, pub: q.published_rate, ack: q.acked_rate});
    if (h.length > 120) h.shift();
  }
  body.replaceChildren(...queues.map((q) => el("tr", {"data-queue": q.name},
    el("td", {class: "name", onclick: () => selectQueue(q.name)}, q.name), el("td", {}, q.partitions),
    el("td", {class: "ready"}, q.ready),
    el("td", {}, q.unacked), el("td", {}, q.published_rate), el("td", {}, q.delivered_rate),
    el("td", {}, q.acked_rate), el("td", {}, q.depth + (q.complete ? "" : "+")),
    el("td", {class: "admin-only"},
       // (a stream is not purged: its retention drops old messages)
       q.type === "stream" ? "" : el("button", {class: "purge", onclick: () => purge(q.name)}, "Purge"), " ",
       el("button", {class: "delete", onclick: () => del(q.name)}, "Delete")))));
}

async function selectQueue(name) {
  selectedQueue = name;
  document.getElementById("queue-panel").hidden = false;
  document.getElementById("queue-panel-title").textContent = `queue ${name}`;
  drawChart();
  try {
    const q = await api("GET", `/api/v1/queues/${encodeURIComponent(name)}`);
    const bounds = [q.max_length ? `max_length ${q.max_length}` : "",
                    q.max_length_bytes ? `max_length_bytes ${q.max_length_bytes}` : ""].filter(Boolean);
    document.getElementById("queue-settings").textContent =
      `mapper ${q.mapper}; ${bounds.length ? `${bounds.join(", ")}, overflow ${q.overflow}` : "no bound"}` +
      (q.message_ttl ? `; messages expire after ${q.message_ttl} ms` : "") +
      (q.type === "stream" ? `; a stream, kept ${q.max_age ? `${q.max_age / 1000} s` : "for ever"}` +
                             (q.max_bytes ? `, up to ${q.max_bytes} bytes a partition` : "") : "") +
      (q.expires ? `; deleted when unused for ${q.expires} ms` : "") +
      (q.delayed ? `; ${q.delayed} delayed` : "") + (q.expired ? `; ${q.expired} expired` : "") +
      (q.dead_letter_queue ? `; dead letters to ${q.dead_letter_queue}` : "") +
      (q.max_deliveries ? `; at most ${q.max_deliveries} deliveries` : "");
    document.querySelector("#queue-partitions tbody").replaceChildren(...q.partition_stats.map((p) => el("tr", {},
      el("td", {}, p.partition), el("td", {}, p.active ?? "-"), el("td", {}, p.ready ?? "?"),
      el("td", {}, p.unacked ?? "?"), el("td", {}, p.next_offset ?? "?"))));
  } catch (e) { say(e.message, true); }
}

function drawChart() {
  const canvas = document.getElementById("queue-chart");
  const h = history.get(selectedQueue) || [];
  canvas.dataset.points = String(h.length);
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, pad = 24;
  ctx.clearRect(0, 0, W, H);
  ctx.font = "11px sans-serif";
  ctx.fillStyle = "#666";
  const series = [["depth", "#3366cc"], ["pub", "#2e9d4e"], ["ack", "#e08a00"]];
  series.forEach(([key, colour], k) => {
    const max = Math.max(1, ...h.map((s) => s[key]));
    ctx.fillStyle = colour;
    ctx.fillText(`${key === "depth" ? "depth" : key === "pub" ? "published/s" : "acked/s"} max ${Math.round(max)}`,
                 pad + k * 170, 12);
    ctx.strokeStyle = colour;
    ctx.beginPath();
    h.forEach((s, i) => {
      const x = pad + (W - 2 * pad) * (h.length > 1 ? i / (h.length - 1) : 0);
      const y = H - pad - (H - 2 * pad - 10) * (s[key] / max);
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
  });
}

function renderPartitions(parts) {
  const f = document.getElementById("partition-filter").value.trim().toLowerCase();
  const rows = parts.filter((p) => !f || [p.queue || "(catalogue)", p.active, p.state]
    .some((x) => String(x).toLowerCase().includes(f)));
  document.querySelector("#partitions tbody").replaceChildren(...rows.map((p) => el("tr", {},
    el("td", {}, (p.queue || "(catalogue)") + (p.static ? " (static)" : "")), el("td", {}, p.partition),
    el("td", {class: p.state}, p.state),
    el("td", {class: "active"}, p.active || "-"), el("td", {}, p.term), el("td", {}, p.commit),
    el("td", {}, p.replicas.map((r) => `${r.node}:${r.kind}(${r.lag}${r.lag ? `, ${r.lag_seconds}s` : ""})`)
      .join(", ")))));
}

// A rolling upgrade: the group's feature level, builds that differ, record types defined differently.
function renderUpgrade(u) {
  document.getElementById("level").textContent = `feature level ${u.feature_level}`;
  const builds = new Set(u.members.map((m) => m.build || "?"));
  const note = document.getElementById("upgrade-note");
  const lines = [];
  if (builds.size > 1) lines.push("builds side by side: " + u.members.map((m) => `${m.name} ${m.build || "?"}`).join(", "));
  for (const t of u.type_mismatches) {
    lines.push(`record type ${t.type}: here v${t.ours}, ${t.member} v${t.theirs} (converts: ${t.converts})`);
  }
  note.hidden = !lines.length;
  note.textContent = lines.join("; ");
  document.getElementById("finalize-state").textContent = u.finalizable
    ? `every member supports level ${u.finalize_to}` : (u.finalize_refusal || "");
  document.querySelector("#finalize button").disabled = !u.finalizable;
}

function render(o) {
  lastOverview = o;
  if (o.upgrade) renderUpgrade(o.upgrade);
  const q = document.getElementById("quorum");
  q.textContent = `quorum ${o.group.quorum_state}`;
  q.className = `pill ${o.group.quorum_state}`;
  document.getElementById("mode").textContent = modeText(o.group);
  renderQueuesHint(o);
  renderNodes(o.nodes, o.group);
  renderQueues(o.queues);
  renderPartitions(o.partitions);
  if (selectedQueue) drawChart();
}

function addEvent(e) {
  const list = document.getElementById("events");
  list.prepend(el("li", {class: e.kind}, `${e.node}: ${e.text}`));
  while (list.children.length > 200) list.lastChild.remove();
}

async function purge(name) {
  if (!confirm(`Purge every ready message of queue ${name}?`)) return;
  try { const r = await api("POST", `/api/v1/queues/${encodeURIComponent(name)}/purge`);
        say(`purged ${r.purged} message(s) from ${name}`); } catch (e) { say(e.message, true); }
}

async function del(name) {
  if (!confirm(`Delete queue ${name} and its messages?`)) return;
  try { await api("DELETE", `/api/v1/queues/${encodeURIComponent(name)}`); say(`deleted ${name}`); }
  catch (e) { say(e.message, true); }
}

// Users and grants: read when the page opens and after each change (they change rarely).
async function loadAccess() {
  if (!session.admin) return;
  const [users, acls] = await Promise.all([api("GET", "/api/v1/users"), api("GET", "/api/v1/acls")]);
  document.querySelector("#users tbody").replaceChildren(...users.map((u) => el("tr", {"data-user": u.name},
    el("td", {}, u.name), el("td", {}, u.role),
    el("td", {}, u.name === session.user ? "" : el("button", {class: "link", onclick: () => delUser(u.name)},
                                                  "delete")))));
  const sel = document.getElementById("grant-user");
  const keep = sel.value;
  sel.replaceChildren(...users.map((u) => el("option", {value: u.name}, u.name)));
  if (keep) sel.value = keep;
  document.querySelector("#acls tbody").replaceChildren(...acls.map((a) => el("tr",
    {"data-user": a.user, "data-pattern": a.pattern},
    el("td", {}, a.user), el("td", {}, a.pattern), el("td", {class: "permissions"}, a.permissions.join(", ")),
    el("td", {}, el("button", {class: "link", onclick: () => revoke(a)}, "revoke")))));
}

async function delUser(name) {
  if (!confirm(`Delete user ${name} and its grants? Its connections close.`)) return;
  try { await api("DELETE", `/api/v1/users/${encodeURIComponent(name)}`); say(`deleted user ${name}`); }
  catch (e) { say(e.message, true); }
  await loadAccess();
}

async function revoke(a) {
  if (!confirm(`Revoke ${a.permissions.join(", ")} on ${a.pattern} from ${a.user}?`)) return;
  try { await api("POST", "/api/v1/acls/revoke", a); say(`revoked ${a.permissions.join(", ")} on ${a.pattern} from ${a.user}`); }
  catch (e) { say(e.message, true); }
  await loadAccess();
}

function wire() {
  document.getElementById("create-user").onsubmit = async (ev) => {
    ev.preventDefault();
    const name = document.getElementById("new-user-name").value.trim();
    const password = document.getElementById("new-user-password").value;
    const role = document.getElementById("new-user-role").value;
    try { await api("POST", "/api/v1/users", {name, password, role}); say(`created user ${name} (${role})`);
          document.getElementById("new-user-password").value = ""; }
    catch (e) { say(e.message, true); }
    await loadAccess();
  };
  document.getElementById("grant").onsubmit = async (ev) => {
    ev.preventDefault();
    const user = document.getElementById("grant-user").value;
    const pattern = document.getElementById("grant-pattern").value.trim();
    const permissions = [...document.querySelectorAll("#grant-permissions input:checked")].map((c) => c.value);
    try { await api("POST", "/api/v1/acls", {user, pattern, permissions});
          say(`granted ${permissions.join(", ")} on ${pattern} to ${user}`); }
    catch (e) { say(e.message, true); }
    await loadAccess();
  };
  document.getElementById("logout").onclick = async () => { await api("POST", "/logout"); location = "/login"; };
  document.getElementById("partition-filter").oninput = () => lastOverview && renderPartitions(lastOverview.partitions);
  document.getElementById("create-queue").onsubmit = async (ev) => {
    ev.preventDefault();
    const name = document.getElementById("new-queue-name").value.trim();
    const partitions = parseInt(document.getElementById("new-queue-partitions").value, 10);
    const placement = document.getElementById("new-queue-placement").value.trim();
    const body = {name, partitions};
    if (placement) body.placement = placement;
    const maxLength = parseInt(document.getElementById("new-queue-max-length").value, 10);
    const maxBytes = parseInt(document.getElementById("new-queue-max-bytes").value, 10);
    if (maxLength > 0) body.max_length = maxLength;
    if (maxBytes > 0) body.max_length_bytes = maxBytes;
    if (body.max_length || body.max_length_bytes) body.overflow = document.getElementById("new-queue-overflow").value;
    const ttl = parseInt(document.getElementById("new-queue-ttl").value, 10);
    if (ttl > 0) body.message_ttl = ttl;
    if (document.getElementById("new-queue-type").value === "stream") {
      body.type = "stream";
      const age = parseFloat(document.getElementById("new-queue-max-age").value);
      const keep = parseInt(document.getElementById("new-queue-retention-bytes").value, 10);
      if (age > 0) body.max_age = Math.round(age * 1000);
      if (keep > 0) body.max_bytes = keep;
    }
    if (!confirm(`Create ${body.type === "stream" ? "stream" : "queue"} ${name} with ${partitions} partition(s)` +
                 (placement ? ` placed on ${placement}` : "") +
                 (body.overflow ? ` bounded (${body.overflow})?` : "?"))) return;
    try { const r = await api("POST", "/api/v1/queues", body);
          say(r.created ? `created ${name}` : `${name} exists already with these settings`); }
    catch (e) { say(e.message, true); }
  };
  document.getElementById("set-override").onsubmit = async (ev) => {
    ev.preventDefault();
    const node = document.getElementById("override-node").value;
    const v = document.getElementById("override-nodes").value;
    const nodes = v === "" ? null : parseInt(v, 10);
    if (!confirm(nodes === null ? `Clear the quorum override on ${node}?`
                                : `Let ${node} keep quorum with ${nodes} node(s) up? Writes may be lost on healing.`)) return;
    try { await api("POST", "/api/v1/group/quorum-override", {node, nodes}); say(`quorum_override on ${node}: ${nodes ?? "cleared"}`); }
    catch (e) { say(e.message, true); }
  };
  document.getElementById("drain").onsubmit = async (ev) => {
    ev.preventDefault();
    const node = document.getElementById("drain-node").value;
    const verb = ev.submitter && ev.submitter.value === "undrain" ? "undrain" : "drain";
    if (!confirm(verb === "drain" ? `Drain ${node}? Its actives move to other members.`
                                  : `Undrain ${node}? Failback hands its partitions back.`)) return;
    try { await api("POST", `/api/v1/nodes/${encodeURIComponent(node)}/${verb}`);
          say(`${node}: ${verb === "drain" ? "drained" : "undrained"}`); } catch (e) { say(e.message, true); }
  };
  document.getElementById("finalize").onsubmit = async (ev) => {
    ev.preventDefault();
    if (!confirm("Finalize the upgrade? The group's feature level goes up, and no member can go back to an older "
                 + "build after it.")) return;
    try { const r = await api("POST", "/api/v1/upgrade/finalize", {});
          say(`the group is at feature level ${r.feature_level}`);
          renderUpgrade(await api("GET", "/api/v1/upgrade")); } catch (e) { say(e.message, true); }
  };
  document.getElementById("move-partition").onsubmit = async (ev) => {
    ev.preventDefault();
    const queue = document.getElementById("move-queue").value.trim();
    const partition = Number(document.getElementById("move-partition-no").value);
    const to = document.getElementById("move-to").value.split(",").map((n) => n.trim()).filter((n) => n);
    const force = document.getElementById("move-force").checked;
    if (!confirm(`Move ${queue}/${partition} to ${to.join(", ")}? Its copies move while it runs.` +
                 (force ? " Then every replica is copied afresh, one at a time." : ""))) return;
    try { await api("POST", `/api/v1/queues/${encodeURIComponent(queue)}/partitions/${partition}/move`,
                    force ? {to, force_replication: true} : {to});
          say(`${queue}/${partition}: moving to ${to.join(", ")} (state Replicating, then Migrating, then Active)` +
              (force ? "; then re-copying each replica" : "")); }
    catch (e) { say(e.message, true); }
  };
  document.getElementById("repartition").onsubmit = async (ev) => {
    ev.preventDefault();
    const queue = document.getElementById("repart-queue").value.trim();
    const path = `/api/v1/queues/${encodeURIComponent(queue)}`;
    if (ev.submitter && ev.submitter.value === "update") {
      const mapper = document.getElementById("repart-mapper").value.trim();
      if (!confirm(`Re-map every message of ${queue}${mapper ? ` with mapper ${mapper}` : ""}? Each partition ` +
                   "stops delivering while its messages are re-mapped.")) return;
      try { await api("POST", `${path}/update`, mapper ? {mapper} : {});
            say(`${queue}: update under way (partitions Updating, then Active)`); } catch (e) { say(e.message, true); }
      return;
    }
    const count = Number(document.getElementById("repart-count").value);
    if (!confirm(`Add ${count} partition(s) to ${queue}?`)) return;
    try { const r = await api("POST", `${path}/partitions`, {count});
          say(`${queue} now has ${r.partitions} partitions (Update re-maps what it holds)`); }
    catch (e) { say(e.message, true); }
  };
  document.getElementById("group-member").onsubmit = async (ev) => {
    ev.preventDefault();
    const name = document.getElementById("member-name").value.trim();
    const address = document.getElementById("member-address").value.trim();
    const zone = document.getElementById("member-zone").value.trim();
    if (ev.submitter && ev.submitter.value === "remove") {
      if (!confirm(`Remove ${name} from the group? Its partitions move to the other members, then it leaves.`)) return;
      try { await api("DELETE", `/api/v1/group/members/${encodeURIComponent(name)}`);
            say(`${name} leaving: partitions re-spreading`); } catch (e) { say(e.message, true); }
      return;
    }
    if (!confirm(`Add ${name} at ${address}? The partitions re-spread over the members.`)) return;
    try { await api("POST", "/api/v1/group/members", {name, address, ...(zone ? {zone} : {})});
          say(`${name} added: partitions re-spreading`); } catch (e) { say(e.message, true); }
  };
  document.getElementById("restore").onsubmit = async (ev) => {
    ev.preventDefault();
    const body = {};
    const origin = document.getElementById("restore-from").value.trim();
    const queue = document.getElementById("restore-queue").value.trim();
    const partition = document.getElementById("restore-partition").value.trim();
    if (origin) body.from = origin;
    if (queue) body.queue = queue;
    if (partition !== "") body.partition = Number(partition);
    if (!confirm("Publish the quarantined messages" + (queue ? ` of ${queue}` : "") + " to their queues again? " +
                 "Consumers get them as new messages.")) return;
    try { const r = await api("POST", "/api/v1/restore", body); say(r.text.join(" · ")); }
    catch (e) { say(e.message, true); }
  };
  document.getElementById("set-priority").onsubmit = async (ev) => {
    ev.preventDefault();
    const node = document.getElementById("priority-node").value;
    const priority = parseInt(document.getElementById("priority-value").value, 10);
    if (!confirm(`Set the priority of ${node} to ${priority}?`)) return;
    try { await api("POST", `/api/v1/nodes/${encodeURIComponent(node)}/priority`, {priority});
          say(`priority of ${node}: ${priority}`); } catch (e) { say(e.message, true); }
  };
}

async function main() {
  session = await api("GET", "/api/v1/session");
  document.getElementById("whoami").textContent = `${session.user} (${session.role}) on ${session.node}`;
  if (!session.admin) document.body.classList.add("monitor");
  wire();
  await loadAccess();
  render(await api("GET", "/api/v1/overview"));
  (await api("GET", "/api/v1/events")).forEach(addEvent);
  const stream = new EventSource("/api/v1/events/stream");
  let seen = new Set([...document.querySelectorAll("#events li")].map((li) => li.textContent));
  stream.addEventListener("overview", (m) => render({...lastOverview, ...JSON.parse(m.data)}));
  stream.addEventListener("ha", (m) => {
    const e = JSON.parse(m.data);
    const key = `${e.node}: ${e.text}`;
    if (!seen.has(key)) { seen.add(key); addEvent(e); }
  });
}

main().catch((e) => say(e.message, true));
