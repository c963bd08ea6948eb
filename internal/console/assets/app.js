// The flowd console: one ES module, no build step. Each view has a hash route; data comes
// from /api/v1/ (the NATS commands over HTTP) and live updates from /api/v1/events.

const app = document.getElementById('app');
const state = { session: null, allowed: {}, events: [], lag: {}, rates: [], timer: null, es: null, page: 0, msg: {}, forms: {}, notices: [] };
const PAGE = 100;
const POLL_MS = 2000;

// h builds an element: h('a', {href: '#/'}, 'text', child…).
function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) el.setAttribute(k, v === true ? '' : v);
  }
  for (const k of kids.flat(Infinity)) if (k !== null && k !== undefined) el.append(k instanceof Node ? k : String(k));
  return el;
}

class APIError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path, body) {
  let resp;
  try {
    resp = await fetch('/api/v1/' + path, body === undefined ? {} : {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
    });
  } catch (e) {
    throw new APIError(0, 'no daemon answers: ' + e.message);
  }
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
  if (!resp.ok) throw new APIError(resp.status, (data && data.error && data.error.message) || resp.statusText);
  return data;
}

const can = (cmd) => state.allowed[cmd] === true;

function errorBox(e) {
  let msg = e.message;
  if (e.status === 403 && /admin role/.test(msg)) msg = 'You need the admin role: ' + msg;
  return h('div', { class: 'error', role: 'alert' }, msg);
}

function empty(text) { return h('p', { class: 'empty' }, text); }

function table(cols, rows, empt) {
  if (!rows.length) return empty(empt);
  return h('table', {}, h('thead', {}, h('tr', {}, cols.map((c) => h('th', { scope: 'col' }, c)))),
    h('tbody', {}, rows.map((r) => h('tr', {}, r.map((c) => h('td', {}, c))))));
}

// chart draws a line chart of points [{t, v}] as inline SVG.
function chart(points, label) {
  const W = 600, H = 160, P = 30;
  const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
  svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
  svg.setAttribute('class', 'chart');
  svg.setAttribute('role', 'img');
  const last = points.length ? points[points.length - 1].v : 0;
  svg.setAttribute('aria-label', `${label}: ${last}`);
  svg.dataset.last = String(last);
  const max = Math.max(1, ...points.map((p) => p.v));
  const t0 = points.length ? points[0].t : 0, t1 = points.length ? points[points.length - 1].t : 1;
  const x = (t) => P + ((t - t0) / Math.max(1, t1 - t0)) * (W - 2 * P);
  const y = (v) => H - P - (v / max) * (H - 2 * P);
  const ns = (tag, a) => { const e = document.createElementNS('http://www.w3.org/2000/svg', tag); for (const k in a) e.setAttribute(k, a[k]); return e; };
  svg.append(ns('line', { x1: P, y1: H - P, x2: W - P, y2: H - P, class: 'axis' }));
  svg.append(ns('line', { x1: P, y1: P, x2: P, y2: H - P, class: 'axis' }));
  const tmax = ns('text', { x: 2, y: P, class: 'tick' }); tmax.textContent = String(Math.round(max)); svg.append(tmax);
  const tz = ns('text', { x: 2, y: H - P, class: 'tick' }); tz.textContent = '0'; svg.append(tz);
  if (points.length) {
    svg.append(ns('polyline', { points: points.map((p) => `${x(p.t)},${y(p.v)}`).join(' '), class: 'line' }));
  }
  const cap = ns('text', { x: W - P, y: P - 8, class: 'tick', 'text-anchor': 'end' });
  cap.textContent = `${label}: ${last}`;
  svg.append(cap);
  return svg;
}

function confirmButton(label, question, action) {
  return h('button', { type: 'button', onclick: async () => { if (confirm(question)) await action(); } }, label);
}

function nav(route) {
  const items = [['overview', 'Overview'], ['topics', 'Topics'], ['groups', 'Groups'], ['messages', 'Messages'],
    ['pipelines', 'Pipelines'], ['plugins', 'Plugins'], ['events', 'Events']];
  return h('nav', { 'aria-label': 'views' }, h('span', { class: 'brand' }, 'flowd'),
    items.map(([r, t]) => h('a', { href: '#/' + r, 'aria-current': route === r ? 'page' : null }, t)),
    h('span', { class: 'who' }, state.session ? `${state.session.user || 'anonymous'} · ${state.session.role}` : ''));
}

// views: each takes the route's arguments and returns an element (or a promise of one).
const views = {
  async overview() {
    const st = await api('broker/status');
    const stats = await api('stats');
    let total = 0;
    for (const t of Object.values(stats.topics)) total += t.messages;
    state.rates.push({ t: Date.now(), total });
    if (state.rates.length > 60) state.rates.shift();
    const pts = [];
    for (let i = 1; i < state.rates.length; i++) {
      const a = state.rates[i - 1], b = state.rates[i];
      pts.push({ t: b.t, v: Math.max(0, Math.round((b.total - a.total) / ((b.t - a.t) / 1000))) });
    }
    let cl = null;
    try { cl = await api('cluster/status'); } catch (e) { cl = null; }
    const s = st.store || {};
    return h('section', {}, h('h1', {}, 'Overview'),
      h('dl', { class: 'facts' }, [['Node', st.node], ['Cluster', st.cluster], ['Version', state.session.version || ''],
        ['Uptime', Math.round(st.uptime_seconds) + ' s'], ['Broker', st.addresses.broker], ['NATS', st.addresses.nats || 'off'],
        ['Topics', st.topics], ['Groups', st.groups], ['Clients', st.clients],
        ['Commit log', `${s.commit_log_min_offset}…${s.commit_log_max_offset}`], ['Flushed offset', s.flushed_offset],
        ['Segments', s.segments], ['Write failure', s.write_failure || 'none']].map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)])),
      h('h2', {}, 'Messages per second'), chart(pts, 'messages/s'),
      cl ? [h('h2', {}, 'Brokers'), table(['Name', 'Address', 'Version', 'Heartbeat', 'Self'],
        (cl.brokers || []).map((b) => [b.name, b.addr, b.version || '', b.heartbeat || '', b.self ? 'yes' : '']), 'No brokers.'),
      cl.nats ? h('p', {}, `NATS cluster ${cl.nats.name || '-'}, meta leader ${cl.nats.meta_leader || '-'}`) : null] : null);
  },

  async topics() {
    // One page at a time from the server: a broker may have 10 000 topics.
    const q = (sessionStorage.getItem('topicFilter') || '');
    const req = { offset: state.page * PAGE, limit: PAGE };
    if (q) req.contains = q;
    let list = await api('topic/list', req);
    const pages = Math.max(1, Math.ceil(list.total / PAGE));
    if (state.page > pages - 1) { state.page = pages - 1; list = await api('topic/list', { ...req, offset: state.page * PAGE }); }
    const shown = list.topics, stats = { topics: list.stats || {} }, all = { length: list.total };
    const filter = h('input', { type: 'search', id: 'topic-filter', placeholder: 'filter topics', 'aria-label': 'filter topics', value: sessionStorage.getItem('topicFilter') || '',
      oninput: (e) => { sessionStorage.setItem('topicFilter', e.target.value); state.page = 0; render(); } });
    const form = can('topic.create') ? h('form', { class: 'inline', id: 'create-topic', onsubmit: async (e) => {
      e.preventDefault();
      const f = new FormData(e.target);
      try { await api('topic/create', { topic: f.get('topic'), queues: Number(f.get('queues')) }); render(); } catch (err) { e.target.append(errorBox(err)); }
    } }, h('input', { name: 'topic', placeholder: 'new topic', 'aria-label': 'new topic name', required: true }),
    h('input', { name: 'queues', type: 'number', min: 1, max: 1024, value: 4, 'aria-label': 'queues' }),
    h('button', { type: 'submit' }, 'Create topic')) : null;
    return h('section', {}, h('h1', {}, 'Topics'), h('div', { class: 'bar' }, filter, form),
      table(['Topic', 'Kind', 'Queues (r/w)', 'Perm', 'Messages', 'Rate/s'], shown.map((t) => {
        const s = stats.topics[t.topic] || {};
        return [h('a', { href: '#/topics/' + encodeURIComponent(t.topic) }, t.topic), t.kind, `${t.read_queues}/${t.write_queues}`, t.perm,
          s.messages ?? '', s.rate !== undefined ? s.rate.toFixed(1) : ''];
      }), 'No topics.'),
      h('div', { class: 'pager' },
        h('button', { type: 'button', disabled: state.page === 0, onclick: () => { state.page--; render(); } }, 'Previous'),
        ` page ${state.page + 1} of ${pages} · ${all.length} topics `,
        h('button', { type: 'button', disabled: state.page >= pages - 1, onclick: () => { state.page++; render(); } }, 'Next')));
  },

  async topic(name) {
    const d = await api('topic/describe', { topic: name });
    const actions = [];
    if (can('topic.delete')) actions.push(confirmButton('Delete topic', `Delete topic ${name}?`, async () => { await api('topic/delete', { topic: name }); location.hash = '#/topics'; }));
    return h('section', {}, h('h1', {}, 'Topic ', h('code', {}, name)), h('div', { class: 'bar' }, actions),
      h('p', {}, `${d.messages} messages, ${d.topic.read_queues}/${d.topic.write_queues} queues, perm ${d.topic.perm}` + (d.rate !== undefined ? `, ${d.rate.toFixed(1)}/s` : '')),
      table(['Queue', 'Min offset', 'Max offset', 'Last store time'], d.queues.map((q) => [q.queue, q.min_offset, q.max_offset, q.last_store_time || ''])), 'No queues.');
  },

  async groups() {
    const l = await api('group/list');
    return h('section', {}, h('h1', {}, 'Groups'), table(['Group', 'Members', 'Topics', 'Lag'],
      l.groups.map((g) => [h('a', { href: '#/groups/' + encodeURIComponent(g.group) }, g.group), g.members, (g.topics || []).join(', '), g.lag]), 'No consumer groups yet.'));
  },

  async group(name) {
    const d = await api('group/describe', { group: name });
    const hist = state.lag[name] || (state.lag[name] = []);
    hist.push({ t: Date.now(), v: d.lag });
    if (hist.length > 90) hist.shift();
    const reset = can('group.reset_offset') && d.topics.length ? h('form', { class: 'inline', id: 'reset', onsubmit: async (e) => {
      e.preventDefault();
      const f = new FormData(e.target);
      const req = { group: name, topic: f.get('topic') };
      if (f.get('to') === 'time') req.timestamp = new Date(f.get('time')).toISOString(); else req.to = f.get('to');
      if (!confirm(`Reset ${name} on ${req.topic} to ${req.to || req.timestamp}?`)) return;
      try { await api('group/reset_offset', req); render(); } catch (err) { e.target.append(errorBox(err)); }
    } }, h('select', { name: 'topic', 'aria-label': 'topic' }, d.topics.map((t) => h('option', {}, t.topic))),
    h('select', { name: 'to', 'aria-label': 'reset to' }, h('option', { value: 'earliest' }, 'earliest'), h('option', { value: 'latest' }, 'latest'), h('option', { value: 'time' }, 'time')),
    h('input', { name: 'time', type: 'datetime-local', 'aria-label': 'time' }), h('button', { type: 'submit' }, 'Reset offsets')) : null;
    return h('section', {}, h('h1', {}, 'Group ', h('code', {}, name)),
      h('p', {}, `lag ${d.lag}`, d.message_model ? ` · ${d.message_model}` : ''),
      h('h2', {}, 'Lag'), chart(hist, 'lag'), reset,
      h('h2', {}, 'Members'), table(['Client id', 'Address', 'Last heartbeat'], (d.members || []).map((m) => [m.client_id, m.remote_addr, m.last_heartbeat]), 'No live members.'),
      h('h2', {}, 'Queues'), table(['Topic', 'Queue', 'Committed', 'Max offset', 'Lag', 'Owner'],
        d.topics.flatMap((t) => t.queues.map((q) => [t.topic, q.queue, q.committed ?? '-', q.max_offset, q.lag, q.owner || ''])), 'No queues.'));
  },

  async messages() {
    const m = state.msg;
    const out = h('div', { id: 'results' });
    const fail = (err) => { m.error = err; m.results = null; render(); };
    const run = async (kind, req) => {
      m.error = null;
      try {
        if (kind === 'browse') { m.reply = await api('message/browse', req); m.results = m.reply.messages; }
        else if (kind === 'search') { m.reply = await api('message/search', req); m.results = m.reply.matches; }
        else if (kind === 'get') { m.reply = null; m.results = [await api('message/get', req)]; }
        else { m.reply = null; m.results = (await api('message/query', req)).messages; }
        m.kind = kind; m.req = req;
      } catch (err) { fail(err); return; }
      render();
    };
    const form = (id, label, fields, submit) => h('form', { class: 'inline', id, onsubmit: async (e) => {
      e.preventDefault();
      await submit(new FormData(e.target));
    } }, fields, h('button', { type: 'submit' }, label));
    const byID = form('by-id', 'Look up by id', field('by-id', 'id', { placeholder: 'offset message id', 'aria-label': 'message id', required: true }),
      (f) => run('get', { msg_id: f.get('id') }));
    const byKey = form('by-key', 'Look up by key', [field('by-key', 'topic', { placeholder: 'topic', 'aria-label': 'topic', required: true }),
      field('by-key', 'key', { placeholder: 'key', 'aria-label': 'key', required: true }),
      h('label', {}, h('input', { type: 'checkbox', name: 'unique' }), ' unique key')],
    (f) => run('query', { topic: f.get('topic'), key: f.get('key'), unique: f.get('unique') === 'on' }));
    const browse = form('browse', 'Browse', [field('browse', 'topic', { placeholder: 'topic', 'aria-label': 'browse topic', required: true }),
      field('browse', 'queue', { type: 'number', min: 0, placeholder: 'queue', 'aria-label': 'queue', required: true }),
      field('browse', 'offset', { type: 'number', min: 0, placeholder: 'from offset', 'aria-label': 'from offset' }),
      field('browse', 'time', { type: 'datetime-local', 'aria-label': 'from time' }),
      field('browse', 'max', { type: 'number', min: 1, max: 100, placeholder: 'per page (20)', 'aria-label': 'per page' })],
    (f) => {
      const req = { topic: f.get('topic'), queue: Number(f.get('queue')) };
      if (f.get('offset')) req.offset = Number(f.get('offset')); else if (f.get('time')) req.timestamp = new Date(f.get('time')).toISOString();
      if (f.get('max')) req.max = Number(f.get('max'));
      return run('browse', req);
    });
    const search = form('search', 'Search', [field('search', 'topic', { placeholder: 'topic', 'aria-label': 'search topic', required: true }),
      field('search', 'sql92', { placeholder: "SQL92, e.g. region = 'eu'", 'aria-label': 'SQL92 expression', size: 28 }),
      field('search', 'filter', { placeholder: 'or a filter plugin', 'aria-label': 'filter plugin' }),
      field('search', 'max', { type: 'number', min: 1, max: 100, placeholder: 'matches a page (20)', 'aria-label': 'matches a page' })],
    (f) => {
      const req = { topic: f.get('topic') };
      if (f.get('sql92')) req.sql92 = f.get('sql92');
      if (f.get('filter')) req.filter = f.get('filter');
      if (f.get('max')) req.max_matches = Number(f.get('max'));
      return run('search', req);
    });
    const send = can('message.send') ? form('send', 'Send test message', [field('send', 'topic', { placeholder: 'topic', 'aria-label': 'send topic', required: true }),
      field('send', 'tags', { placeholder: 'tags', 'aria-label': 'tags' }), field('send', 'keys', { placeholder: 'keys (space separated)', 'aria-label': 'keys' }),
      field('send', 'body', { placeholder: 'body', 'aria-label': 'body', required: true, size: 30 })],
    async (f) => {
      const req = { topic: f.get('topic'), body: f.get('body') };
      if (f.get('tags')) req.tags = f.get('tags');
      if (f.get('keys')) req.keys = f.get('keys').split(/\s+/).filter(Boolean);
      try { m.sent = await api('message/send', req); m.error = null; } catch (err) { m.sent = null; m.error = err; }
      render();
    }) : null;
    if (m.error) out.append(errorBox(m.error));
    if (m.sent) out.append(h('p', { id: 'sent' }, `Sent to ${m.sent.topic} queue ${m.sent.queue} at offset ${m.sent.offset}: `, h('code', {}, m.sent.msg_id)));
    if (m.results) {
      out.append(m.results.length ? table(['Msg id', 'Queue', 'Offset', 'Stored', 'Properties', 'Body'], m.results.map((x) => [x.msg_id, x.queue, x.offset, x.store_time,
        h('code', {}, JSON.stringify(x.properties)), bodyView(x.body)]), '') : empty('No messages match.'));
    }
    if (m.results && m.kind === 'browse') {
      const r = m.reply;
      out.append(h('div', { class: 'pager', id: 'browse-pager' }, `offsets ${r.offset}…${r.next - 1} of ${r.min_offset}…${r.max_offset - 1} `,
        h('button', { type: 'button', id: 'browse-next', disabled: r.next >= r.max_offset,
          onclick: () => run('browse', { ...m.req, offset: r.next, timestamp: undefined }) }, 'Next page')));
    }
    if (m.results && m.kind === 'search') {
      const r = m.reply;
      out.append(h('div', { class: 'pager', id: 'search-pager' }, `${r.scanned} scanned` + (r.stopped ? `, stopped on ${r.stopped} ` : ', every queue scanned '),
        h('button', { type: 'button', id: 'search-next', disabled: !r.stopped,
          onclick: () => run('search', { ...m.req, positions: r.next }) }, 'More matches')));
    }
    return h('section', {}, h('h1', {}, 'Messages'), h('h2', {}, 'Look up'), byID, byKey, h('h2', {}, 'Browse a queue'), browse,
      h('h2', {}, 'Search'), search, send ? [h('h2', {}, 'Send a test message'), send] : null, h('h2', {}, 'Results'), out);
  },

  async pipelines() {
    const l = await api('pipeline/list');
    const act = (p, verb) => h('button', { type: 'button', 'data-action': verb, onclick: async (e) => {
      try { await api('pipeline/' + verb, { name: p.name }); render(); } catch (err) { e.target.after(errorBox(err)); }
    } }, verb[0].toUpperCase() + verb.slice(1));
    return h('section', {}, h('h1', {}, 'Pipelines'), table(['Name', 'State', 'In', 'Out', 'Filtered', 'Failed', 'Lag', 'Last error', ''],
      l.pipelines.map((p) => {
        const lag = (p.queues || []).reduce((a, q) => a + Math.max(0, q.lag), 0);
        const c = p.counters || {};
        const btns = [];
        if (can('pipeline.pause') && p.state === 'running') btns.push(act(p, 'pause'));
        if (can('pipeline.resume') && p.state === 'paused') btns.push(act(p, 'resume'));
        if (can('pipeline.seek')) btns.push(confirmButton('Seek to first', `Move ${p.name} to the first message?`, async () => { await api('pipeline/seek', { name: p.name, position: 'first' }); render(); }));
        return [p.name, h('span', { class: 'state-' + p.state, 'data-state': p.state }, p.state), c.in, c.out, c.filtered, c.failed, lag, p.error || '', btns];
      }), 'No pipelines: add them to the configuration\'s pipelines list.'));
  },

  async plugins() {
    const l = await api('plugin/list');
    const deploy = can('plugin.deploy') ? h('form', { class: 'inline', onsubmit: async (e) => {
      e.preventDefault();
      const f = new FormData(e.target);
      try {
        const manifest = JSON.parse(await f.get('manifest').text());
        const bytes = new Uint8Array(await f.get('module').arrayBuffer());
        let bin = ''; for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
        await api('plugin/deploy', { manifest, module: btoa(bin), activate: f.get('activate') === 'on' });
        render();
      } catch (err) { e.target.append(errorBox(err)); }
    } }, h('label', {}, 'Manifest ', h('input', { type: 'file', name: 'manifest', accept: '.json', required: true })),
    h('label', {}, 'Module ', h('input', { type: 'file', name: 'module', accept: '.wasm', required: true })),
    h('label', {}, h('input', { type: 'checkbox', name: 'activate' }), ' activate'), h('button', { type: 'submit' }, 'Deploy')) : null;
    const faults = state.events.filter((e) => e.type.startsWith('plugin.'));
    const faultsOf = (st) => Object.entries(st.faults).filter(([, n]) => n > 0).map(([k, n]) => `${k} ${n}`).join(', ') || '0';
    return h('section', {}, h('h1', {}, 'Plugins'), deploy, table(['Name', 'Kind', 'Version', 'Active', 'Calls', 'Faults', 'Mean call', ''], l.plugins.map((p) => {
      const m = p.manifest, btns = [], st = p.stats;
      if (!p.active && can('plugin.activate')) btns.push(h('button', { type: 'button', onclick: async () => { await api('plugin/activate', { name: m.name, version: m.version }); render(); } }, 'Activate'));
      if (!p.active && can('plugin.remove')) btns.push(confirmButton('Remove', `Remove ${m.name} ${m.version}?`, async () => { await api('plugin/remove', { name: m.name, version: m.version }); render(); }));
      return [m.name, m.kind, m.version, p.active ? (st && st.state !== 'active' ? `active (${st.state})` : 'active') : '',
        st ? h('span', { 'data-calls': m.name }, st.calls) : '', st ? h('span', { 'data-faults': m.name }, faultsOf(st)) : '',
        st && st.calls ? `${st.mean_call_us.toFixed(1)} µs` : '', btns];
    }), 'No plugins deployed.'), h('h2', {}, 'Plugin events'),
    table(['Time', 'Type', 'Subject'], faults.map((e) => [e.time, e.type, e.subject || '']), 'No plugin events since this page opened.'));
  },

  events() {
    const kind = sessionStorage.getItem('eventKind') || '';
    const kinds = ['', 'broker', 'topic', 'group', 'offset', 'plugin', 'pipeline', 'cluster'];
    const sel = h('select', { 'aria-label': 'event kind', onchange: (e) => { sessionStorage.setItem('eventKind', e.target.value); render(); } },
      kinds.map((k) => h('option', { value: k, selected: k === kind }, k || 'all kinds')));
    const evs = state.events.filter((e) => !kind || e.type.startsWith(kind + '.'));
    return h('section', {}, h('h1', {}, 'Events'), sel,
      table(['Time', 'Type', 'Subject', 'Data'], evs.slice().reverse().map((e) => [e.time, e.type, e.subject || '', h('code', {}, JSON.stringify(e.data))]), 'No events since this page opened.'));
  },
};

// field is an input whose value outlives the view's redraws (events and polling redraw it).
function field(form, name, attrs) {
  const vals = state.forms[form] || (state.forms[form] = {});
  return h('input', { ...attrs, name, id: `${form}-${name}`, value: vals[name] ?? '', oninput: (e) => { vals[name] = e.target.value; } });
}

// bodyView shows a base64 body as text, pretty JSON or hex.
function bodyView(b64) {
  const raw = atob(b64 || '');
  const bytes = Uint8Array.from(raw, (c) => c.charCodeAt(0));
  const text = new TextDecoder().decode(bytes);
  let pretty = null;
  try { pretty = JSON.stringify(JSON.parse(text), null, 2); } catch (e) { pretty = null; }
  const hex = Array.from(bytes, (x) => x.toString(16).padStart(2, '0')).join(' ');
  const pre = h('pre', {}, pretty || text);
  const pick = (label, v) => h('button', { type: 'button', onclick: () => { pre.textContent = v; } }, label);
  return h('div', {}, pick('text', text), pretty ? pick('json', pretty) : null, pick('hex', hex), pre);
}

function route() {
  const parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  const [view, arg] = parts;
  if (view === 'topics' && arg) return ['topic', arg, 'topics'];
  if (view === 'groups' && arg) return ['group', arg, 'groups'];
  return [views[view] ? view : 'overview', undefined, views[view] ? view : 'overview'];
}

// One render at a time; a render asked for while one runs (a keystroke in the topic
// filter, an event) runs once after it, so the last change is always drawn.
let rendering = false, again = false;
async function render() {
  if (rendering) { again = true; return; }
  rendering = true;
  again = false;
  const [view, arg, top] = route();
  const main = h('main', { id: 'main', 'data-view': view });
  try {
    main.append(await views[view](arg));
  } catch (e) {
    if (e.status === 401) { rendering = false; return signIn(); }
    main.append(errorBox(e));
  } finally {
    rendering = false;
  }
  const focused = document.activeElement && document.activeElement.id;
  const sel = document.activeElement && document.activeElement.selectionStart;
  app.replaceChildren(nav(top), notices(), main);
  if (focused) {
    const el = document.getElementById(focused);
    if (el) { el.focus(); if (sel !== undefined && el.setSelectionRange) el.setSelectionRange(sel, sel); }
  }
  if (again) render();
}

// notices are the plugin faults seen since the page opened, each with a dismiss button.
function notices() {
  if (!state.notices.length) return '';
  return h('div', { id: 'notices' }, state.notices.map((ev, i) => {
    const d = ev.data || {};
    return h('div', { class: 'notice', role: 'alert', 'data-plugin': d.plugin || '' },
      `Plugin ${d.plugin || ev.subject} ${d.pluginVersion || ''} faulted and stopped (${ev.time}): ${d.reason || ''} `,
      h('button', { type: 'button', onclick: () => { state.notices.splice(i, 1); render(); } }, 'Dismiss'));
  }));
}

function signIn(message) {
  clearInterval(state.timer);
  const form = h('form', { class: 'signin', onsubmit: async (e) => {
    e.preventDefault();
    const f = new FormData(e.target);
    const body = f.get('token') ? { token: f.get('token') } : { user: f.get('user'), password: f.get('password') };
    try { await api('session', body); boot(); } catch (err) { signIn(err.message); }
  } }, h('h1', {}, 'Sign in to flowd'), message ? h('div', { class: 'error', role: 'alert' }, message) : null,
  h('label', {}, 'User ', h('input', { name: 'user', autocomplete: 'username' })),
  h('label', {}, 'Password ', h('input', { name: 'password', type: 'password', autocomplete: 'current-password' })),
  h('label', {}, 'or token ', h('input', { name: 'token', type: 'password' })),
  h('button', { type: 'submit' }, 'Sign in'));
  app.replaceChildren(form);
}

function listen() {
  if (state.es) state.es.close();
  state.es = new EventSource('/api/v1/events');
  const onEvent = (msg) => {
    const ev = JSON.parse(msg.data);
    state.events.push(ev);
    if (state.events.length > 500) state.events.shift();
    // A fault that stopped a plugin is shown on every view until dismissed.
    if (ev.type === 'plugin.failed') state.notices.push(ev);
    render();
  };
  // Events are sent without an event name, so that one handler takes every kind.
  state.es.onmessage = onEvent;
}

async function boot() {
  try {
    state.session = await api('session');
    const cmds = await api('commands');
    state.allowed = Object.fromEntries(cmds.commands.map((c) => [c.name, c.allowed]));
  } catch (e) {
    if (e.status === 401) return signIn();
    app.replaceChildren(h('main', {}, errorBox(e)));
    setTimeout(boot, 3000);
    return;
  }
  listen();
  render();
  clearInterval(state.timer);
  // Lag and rates move without events: the page polls what events do not cover.
  state.timer = setInterval(() => { if (!document.querySelector('main form:focus-within')) render(); }, POLL_MS);
}

window.addEventListener('hashchange', () => { state.page = 0; render(); });
boot();
