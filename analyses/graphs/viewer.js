(() => {
const data = JSON.parse(document.getElementById('graph-data').textContent);
const cards = JSON.parse(document.getElementById('graph-cards').textContent);
const qk = data.qk || {};
const position = {};
data.nodes.forEach(n => { position[n.node_id] = n.ctx_idx; });
const svg = document.getElementById('graph');
const info = document.getElementById('info');
const tip = document.getElementById('tip');
const NS = 'http://www.w3.org/2000/svg';
const tokens = data.metadata.prompt_tokens;
const nLayers = Math.max(...data.nodes.map(n => n.layer === 'E' ? 0 : Number(n.layer)));  // the logits' layer
// drawn at its natural size in CSS pixels (no viewBox scaling, so text stays readable). Each prompt position is a
// column as wide as its most crowded cell needs (GAP px per node, within [MIN_COL, MAX_COL]; the columns share the
// window's width when they fit, else #wrap scrolls); a cell's nodes are spread across its column, the most
// influential first (the smallest cumulative `influence`), in as many lines as the row holds when they do not fit
const MIN_COL = 64, MAX_COL = 360, GAP = 16, left = 56, top = 24, bottom = 40;
const rowH = Math.max(36, Math.min(70, 0.7 * window.innerHeight / (nLayers + 2)));
const rowOf = n => n.layer === 'E' ? nLayers : n.feature_type === 'logit' ? 0 : nLayers - 1 - Number(n.layer);
const groups = {};
data.nodes.filter(n => n.feature_type !== 'logit').forEach(n => {
  const k = rowOf(n) + ':' + n.ctx_idx; (groups[k] = groups[k] || []).push(n);
});
const crowd = tokens.map(() => 1);
Object.values(groups).forEach(g => { crowd[g[0].ctx_idx] = Math.max(crowd[g[0].ctx_idx], g.length); });
const lines = Math.max(1, Math.floor((rowH - 12) / GAP) + 1);  // the lines of nodes a row holds
const wanted = crowd.map(c => Math.min(MAX_COL, Math.max(MIN_COL, Math.ceil(c / lines) * GAP + GAP)));
const room = document.getElementById('wrap').clientWidth - left - 8;
const stretch = Math.max(1, room / wanted.reduce((s, w) => s + w, 0));
const colWs = wanted.map(w => w * stretch);
const colX = [0];
colWs.forEach(w => colX.push(colX[colX.length - 1] + w));
const byInfluence = (a, b) => (a.influence == null ? 2 : a.influence) - (b.influence == null ? 2 : b.influence) ||
  (a.node_id < b.node_id ? -1 : 1);
const where = {};
Object.values(groups).forEach(g => {
  g.sort(byInfluence);
  const p = g[0].ctx_idx, w = colWs[p];
  const perLine = Math.max(1, Math.floor((w - GAP) / GAP) + 1);
  const used = Math.min(lines, Math.ceil(g.length / perLine));
  const across = Math.ceil(g.length / used);  // nodes per line, the lines as full as each other
  g.forEach((n, i) => {
    const line = Math.floor(i / across), at = i % across, inLine = Math.min(across, g.length - line * across);
    const dy = used > 1 ? (line - (used - 1) / 2) * Math.min(GAP, (rowH - 12) / (used - 1)) : 0;
    where[n.node_id] = [left + colX[p] + (at + 1) * w / (inLine + 1), top + rowOf(n) * rowH + dy];
  });
});
const xEnd = left + colX[tokens.length];
// the logits side by side along the top row from the right (the target first, above the last position; at most
// 60 px apart, so that their edges do not cross the whole graph), each labelled with its token where there is room
const logits = data.nodes.filter(n => n.feature_type === 'logit');
const logitGap = Math.min(colWs[tokens.length - 1], 60, Math.max(24, (xEnd - left) / Math.max(1, logits.length)));
logits.forEach((n, i) => { where[n.node_id] = [xEnd - (i + 0.5) * logitGap, top]; });
const height = top + nLayers * rowH + bottom;
const width = xEnd + 8;
svg.setAttribute('width', width); svg.setAttribute('height', height);
function element(tag, attributes, parent) {
  const e = document.createElementNS(NS, tag);
  Object.entries(attributes).forEach(([k, v]) => e.setAttribute(k, v));
  parent.appendChild(e);
  return e;
}
// the layer axis: a grid line and a label per row
for (let row = 0; row <= nLayers; row++) {
  const y = top + row * rowH;
  const name = row === 0 ? 'logits' : row === nLayers ? 'tokens' : `L${nLayers - 1 - row}`;
  element('line', {x1: left - 4, x2: width, y1: y, y2: y, class: 'grid'}, svg);
  element('text', {x: 4, y: y + 4, class: 'axis'}, svg).textContent = name;
}
const maxW = data.links.reduce((m, l) => Math.max(m, Math.abs(l.weight)), 1e-12);
// a link's line is made when it is first shown (a page opens showing a fraction of its links: tens of thousands of
// lines take seconds to make and lay out)
const edgesOf = {}, lineOf = new Map();
// supernodes are boxes under everything else: drawn around their members, named above
const boxGroup = element('g', {id: 'supernode-boxes'}, svg);
const BOX_COLOURS = ['#e6ab02', '#1b9e77', '#d95f02', '#7570b3', '#e7298a', '#66a61e', '#a6761d', '#666666'];
const linkGroup = element('g', {id: 'links'}, svg);
function lineFor(l) {
  if (!lineOf.has(l)) {
    const [x1, y1] = where[l.source], [x2, y2] = where[l.target];
    lineOf.set(l, element('line', {x1, y1, x2, y2, stroke: l.weight > 0 ? '#2166ac' : '#b2182b',
                                   'stroke-width': (0.3 + 3 * Math.abs(l.weight) / maxW).toFixed(2),
                                   class: l.heads ? 'link edge' : 'link', 'data-source': l.source,
                                   'data-target': l.target}, linkGroup));
    if (l.heads) lineOf.get(l).addEventListener('click', () => showEdge(l));
  }
  return lineOf.get(l);
}
data.links.forEach(l => {
  (edgesOf[l.source] = edgesOf[l.source] || []).push(l);
  (edgesOf[l.target] = edgesOf[l.target] || []).push(l);
});
Object.values(edgesOf).forEach(ls => ls.sort((a, b) => Math.abs(b.weight) - Math.abs(a.weight)));
const fit = (t, room) => t.length > room / 7 ? t.slice(0, Math.max(1, Math.floor(room / 7) - 1)) + '…' : t;
tokens.forEach((t, i) => {
  const label = element('text', {x: left + colX[i] + colWs[i] / 2, y: height - 14, 'text-anchor': 'middle',
                                 class: 'token'}, svg);
  label.textContent = fit(t, colWs[i]);
  element('title', {}, label).textContent = `${i}: ${t}`;
});
logits.forEach(n => {
  const said = /^Output "(.*)" \(p=/.exec(n.clerp || '');
  if (!said || logitGap < 30) return;
  const [x, y] = where[n.node_id];
  const label = element('text', {x, y: y - 9, 'text-anchor': 'middle', class: 'logit-label'}, svg);
  label.textContent = fit(said[1], logitGap - 4);
  element('title', {}, label).textContent = n.clerp;
});
const colour = {'embedding': '#999', 'logit': '#4daf4a', 'mlp reconstruction error': '#ff7f00'};
// a feature's or error's radius grows with its influence: `influence` is its cumulative share in the ranking,
// so the most influential nodes have the smallest
const radius = n => n.influence == null || n.feature_type === 'embedding' || n.feature_type === 'logit' ? 6 :
  4 + 6 * (1 - Math.min(1, n.influence));
const shapeOf = {}, pinned = new Set();
data.nodes.forEach(n => {
  const [x, y] = where[n.node_id], r = radius(n);
  const error = n.feature_type === 'mlp reconstruction error';
  const shape = error ? element('rect', {x: x - r, y: y - r, width: 2 * r, height: 2 * r}, svg)
                      : element('circle', {cx: x, cy: y, r}, svg);
  shape.setAttribute('fill', colour[n.feature_type] || '#984ea3');
  shape.setAttribute('class', 'node'); shape.setAttribute('data-id', n.node_id);
  shape.addEventListener('click', () => { pin(n); show(n); });
  shape.addEventListener('mouseenter', e => hover(n, e));
  shape.addEventListener('mousemove', e => place(e));
  shape.addEventListener('mouseleave', () => { tip.style.display = 'none'; });
  shapeOf[n.node_id] = shape;
});
// thresholds in the page (see the module docstring): nodes by their place in the influence ranking, then links by
// their share of the shown links' |weight|, each rule keeping the item that crosses its threshold
const nodeSlider = document.getElementById('node-threshold'), edgeSlider = document.getElementById('edge-threshold');
const written = [Number(nodeSlider.max), Number(edgeSlider.max)];
const always = n => n.feature_type === 'embedding' || n.feature_type === 'logit' || n.influence == null;
const ranked = data.nodes.filter(n => !always(n)).map(n => n.influence).sort((a, b) => a - b);
let visible = new Set(data.nodes.map(n => n.node_id)), shownLinks = new Set(data.links);
// a link's rank: its share of the edges' influence (the ranking Graph.prune cuts), |weight| in a JSON without it
const rank = l => l.influence != null ? l.influence : Math.abs(l.weight);
function threshold() {
  const nodeValue = Number(nodeSlider.value), edgeValue = Number(edgeSlider.value);
  const crossing = ranked.find(v => v >= nodeValue - 1e-9);
  const cut = nodeValue >= written[0] || crossing === undefined ? Infinity : crossing;
  const kept = new Set(data.nodes.filter(n => always(n) || n.influence <= cut).map(n => n.node_id));
  const between = data.links.filter(l => kept.has(l.source) && kept.has(l.target))
    .sort((a, b) => rank(b) - rank(a));
  const total = between.reduce((s, l) => s + rank(l), 0);
  const share = edgeValue >= written[1] ? Infinity : edgeValue / written[1];
  shownLinks = new Set();
  let sum = 0;
  for (const l of between) {
    if (sum >= share * total - 1e-12 * total) break;
    shownLinks.add(l); sum += rank(l);
  }
  const linked = new Set();
  shownLinks.forEach(l => { linked.add(l.source); linked.add(l.target); });
  visible = new Set(data.nodes.filter(n => kept.has(n.node_id) && (linked.has(n.node_id) || always(n)))
    .map(n => n.node_id));
  data.links.forEach(l => {
    if (shownLinks.has(l)) lineFor(l).classList.remove('hidden');
    else if (lineOf.has(l)) lineOf.get(l).classList.add('hidden');
  });
  data.nodes.forEach(n => shapeOf[n.node_id].classList.toggle('hidden', !visible.has(n.node_id)));
  document.getElementById('node-value').textContent = nodeValue.toFixed(2);
  document.getElementById('edge-value').textContent = edgeValue.toFixed(3);
  document.getElementById('shown').textContent =
    `showing ${visible.size} of ${data.nodes.length} nodes, ${shownLinks.size} of ${data.links.length} edges`;
  highlight();
}
nodeSlider.addEventListener('input', threshold); edgeSlider.addEventListener('input', threshold);
// pinning: the pinned nodes and their shown links at full opacity, the rest faded
function pin(n) {
  if (pinned.has(n.node_id)) pinned.delete(n.node_id); else pinned.add(n.node_id);
  highlight();
}
function highlight() {
  const near = new Set(pinned);
  data.links.forEach(l => {
    const through = shownLinks.has(l) && (pinned.has(l.source) || pinned.has(l.target));
    if (through) { near.add(l.source); near.add(l.target); }
    if (lineOf.has(l)) lineOf.get(l).classList.toggle('faded', pinned.size > 0 && !through);
  });
  data.nodes.forEach(n => {
    const shape = shapeOf[n.node_id];
    shape.classList.toggle('pinned', pinned.has(n.node_id));
    shape.classList.toggle('faded', pinned.size > 0 && !near.has(n.node_id));
  });
}
document.getElementById('clear').addEventListener('click', () => { pinned.clear(); highlight(); });
// search: a node id ("L_F_P"), or a feature at every position ("L_F"), pins what it names
const search = document.getElementById('search');
search.addEventListener('change', () => {
  const text = search.value.trim();
  const found = data.nodes.filter(n => n.node_id === text || n.node_id.startsWith(text + '_'));
  found.forEach(n => pinned.add(n.node_id));
  document.getElementById('found').textContent = text ? `${found.length} found` : '';
  highlight();
});
// supernodes (Neuronpedia's qParams.supernodes: [name, node_id, ...]): the pinned nodes grouped under a name
const supernodes = data.qParams.supernodes = data.qParams.supernodes || [];
function listSupernodes() {
  document.getElementById('supernodes').innerHTML = supernodes.map(([name, ...ids]) =>
    `<span class="supernode" title="${ids.map(escaped).join(', ')}">${escaped(name)} (${ids.length})</span>`)
    .join(' ');
  const member = new Set(supernodes.flatMap(([, ...ids]) => ids));
  boxGroup.replaceChildren();
  supernodes.forEach(([name, ...ids], i) => {
    const at = ids.filter(id => where[id]).map(id => where[id]);
    if (!at.length) return;
    const xs = at.map(p => p[0]), ys = at.map(p => p[1]), pad = 9;
    const x = Math.min(...xs) - pad, y = Math.min(...ys) - pad;
    const colour = BOX_COLOURS[i % BOX_COLOURS.length];
    element('rect', {x, y, width: Math.max(...xs) - x + pad, height: Math.max(...ys) - y + pad, rx: 5,
                     stroke: colour, class: 'supernode-box', 'data-name': name}, boxGroup);
    const label = element('text', {x: x + 2, y: y - 3, fill: colour, class: 'supernode-name'}, boxGroup);
    label.textContent = name;
  });
  data.nodes.forEach(n => shapeOf[n.node_id].classList.toggle('grouped', member.has(n.node_id)));
}
document.getElementById('group').addEventListener('click', () => {
  const name = document.getElementById('group-name').value.trim() || `group ${supernodes.length + 1}`;
  if (pinned.size) supernodes.push([name, ...pinned]);
  listSupernodes();
});
// export: the pinned nodes, the shown links through them and their ends, and the supernodes, as the graph's JSON
document.getElementById('export').addEventListener('click', () => {
  const links = data.links.filter(l => shownLinks.has(l) && (pinned.has(l.source) || pinned.has(l.target)));
  const ids = new Set([...pinned, ...links.flatMap(l => [l.source, l.target])]);
  const sub = {metadata: data.metadata, qParams: {...data.qParams, pinnedIds: [...pinned]},
               nodes: data.nodes.filter(n => ids.has(n.node_id)), links: links};
  const a = document.getElementById('download');
  a.href = 'data:application/json;charset=utf-8,' + encodeURIComponent(JSON.stringify(sub));
  a.textContent = `subgraph.json (${sub.nodes.length} nodes, ${links.length} edges)`;
});
// the current view (sliders, pins, fading) as an SVG document, with the page's styles it needs inlined
function view() {
  const copy = svg.cloneNode(true);
  copy.querySelectorAll('.hidden').forEach(e => e.remove());
  copy.querySelectorAll('.faded').forEach(e => e.setAttribute('opacity', '0.08'));
  copy.querySelectorAll('.link').forEach(e => { if (!e.getAttribute('opacity')) e.setAttribute('opacity', '0.5'); });
  const outline = (selector, stroke, width) => copy.querySelectorAll(selector).forEach(e => {
    e.setAttribute('stroke', stroke); e.setAttribute('stroke-width', width);
  });
  outline('.node.grouped', '#e6ab02', 2); outline('.node.pinned', '#000', 3);
  copy.setAttribute('font-family', 'sans-serif'); copy.setAttribute('font-size', '13');
  return 'data:image/svg+xml;charset=utf-8,' + encodeURIComponent(new XMLSerializer().serializeToString(copy));
}
document.getElementById('export-svg').addEventListener('click', () => {
  const a = document.getElementById('download-svg');
  a.href = view(); a.textContent = 'view.svg';
});
// the same drawn at twice its size on a white canvas, as a PNG file
document.getElementById('export-png').addEventListener('click', () => {
  const image = new Image();
  image.onload = () => {
    const canvas = document.createElement('canvas');
    canvas.width = 2 * svg.width.baseVal.value; canvas.height = 2 * svg.height.baseVal.value;
    const context = canvas.getContext('2d');
    context.fillStyle = '#fff'; context.fillRect(0, 0, canvas.width, canvas.height);
    context.scale(2, 2); context.drawImage(image, 0, 0);
    const a = document.getElementById('download-png');
    a.href = canvas.toDataURL('image/png'); a.textContent = 'view.png';
  };
  image.src = view();
});
function hover(n, e) {
  const edges = (edgesOf[n.node_id] || []).filter(l => shownLinks.has(l)).slice(0, 3);
  tip.innerHTML = `<b>${escaped(n.node_id)}</b> <small>${escaped(n.feature_type)}</small><br>` +
    (n.clerp ? escaped(n.clerp) + '<br>' : '') +
    (n.activation != null ? `activation ${n.activation.toFixed(4)}<br>` : '') +
    (n.influence != null ? `influence (cumulative) ${n.influence.toFixed(4)}<br>` : '') +
    (edges.length ? 'top edges:<br>' + edges.map(l => `${escaped(l.source)} &rarr; ${escaped(l.target)} ` +
                                                      `${l.weight.toFixed(4)}`).join('<br>') : 'no shown edges');
  tip.style.display = 'block';
  place(e);
}
function place(e) {
  tip.style.left = Math.min(e.clientX + 14, window.innerWidth - tip.offsetWidth - 4) + 'px';
  tip.style.top = Math.min(e.clientY + 14, window.innerHeight - tip.offsetHeight - 4) + 'px';
}
threshold();
listSupernodes();  // the JSON's own supernodes, if it has some
// the JSON's pinned nodes (a circuit's features: resid.analyses.graphs.circuit) pinned as the page opens
(data.qParams.pinnedIds || []).forEach(id => { if (shapeOf[id]) pinned.add(id); });
highlight();
function show(n) {
  const all = edgesOf[n.node_id] || [], edges = all.filter(l => shownLinks.has(l));
  const rows = edges.slice(0, 12).map(l => `<tr><td>${l.source}</td><td>&rarr;</td><td>${l.target}</td>` +
                                           `<td>${l.weight.toFixed(4)}</td><td>${carriers(l, 3)}</td></tr>`).join('');
  const hidden = all.length - edges.length;
  const card = cards[n.node_id] ? `<iframe src="${cards[n.node_id]}" width="100%" height="420"></iframe>` : '';
  info.innerHTML = `<h3>${n.node_id} <small>${n.feature_type}</small></h3>` +
    `<p>layer ${n.layer}, position ${n.ctx_idx}` +
    (n.activation != null ? `, activation ${n.activation.toFixed(4)}` : '') +
    (n.influence != null ? `, cumulative influence ${n.influence.toFixed(4)}` : '') + ` ${n.clerp}</p>` +
    `<table>${rows}</table>` + (hidden ? `<p>${hidden} more hidden by the sliders</p>` : '') + card;
}
// a link's parts by the head of its last attention hop (its "heads", largest first; "heads_rest": how many more
// and their sum), the first k of them
function carriers(l, k) {
  if (!l.heads) return '';
  const parts = Object.entries(l.heads);
  const more = parts.length - Math.min(k, parts.length) + (l.heads_rest ? l.heads_rest[0] : 0);
  const shown = parts.slice(0, k).map(([via, w]) => `${escaped(via)} ${w.toFixed(4)}`).join(', ');
  return 'via ' + shown + (more ? `, +${more} more` : '');
}
function showEdge(l) {
  const key = position[l.source];
  const rows = Object.entries(l.heads).map(([via, w]) => {
    const name = `${via}->${key}`;
    const cell = qk[name] ? `<a href="#" class="qk" data-qk="${escaped(name)}">${escaped(via)}</a>` : escaped(via);
    return `<tr><td>${cell}</td><td>${w.toFixed(4)}</td></tr>`;
  });
  if (l.heads_rest) {
    const [n, w] = l.heads_rest;
    rows.push(`<tr><td>${n} smaller part${n > 1 ? 's' : ''}</td><td>${w.toFixed(4)}</td></tr>`);
  }
  info.innerHTML = `<h3>${l.source} &rarr; ${l.target} <small>weight ${l.weight.toFixed(4)}</small></h3>` +
    `<p>by the head of its last attention hop (residual: no attention)` +
    (Object.keys(qk).length ? '; click a head for why it attended' : '') + `</p><table>${rows.join('')}</table>`;
  info.querySelectorAll('a.qk').forEach(a => a.addEventListener('click', e => {
    e.preventDefault(); showQK(a.getAttribute('data-qk'));
  }));
}
// why a head attended from a query position to a key: its score split into pairs of terms (resid's QK attribution)
function showQK(name) {
  const q = qk[name];
  const [head, key] = name.split('->');
  const table = (title, rows, cells) => `<h4>${title}</h4><table>` +
    rows.map(r => `<tr>${cells(r).map(c => `<td>${c}</td>`).join('')}</tr>`).join('') + '</table>';
  const terms = (title, rows) => table(title, rows, ([site, v]) => [escaped(site), v.toFixed(4)]);
  const pairs = (title, rows) => table(title, rows, ([a, b, v]) => [escaped(a), '&times;', escaped(b), v.toFixed(4)]);
  const m = q.versus_mean;
  info.innerHTML = `<h3>${escaped(head)} attending to position ${key} (${escaped(tokens[Number(key)] || '')})</h3>` +
    `<p>score ${q.score.toFixed(4)}, pattern ${q.pattern.toFixed(4)}; the pairs sum to ${q.raw.toFixed(4)} ` +
    `(the run: ${q.run_raw.toFixed(4)})</p>` + pairs('top pairs (query-side term &times; key-side term)', q.pairs) +
    terms('query-side terms (what makes the head look)', q.query_terms) +
    terms('key-side terms (what makes this key attractive)', q.key_terms) +
    `<h4>against the pattern-weighted mean over keys: ${m.raw.toFixed(4)}</h4>` +
    pairs('top pairs', m.pairs) + terms('query-side terms', m.query_terms) + terms('key-side terms', m.key_terms);
}
function escaped(text) {
  return text.replace(/[&<>"]/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;'})[c]);
}
})();
