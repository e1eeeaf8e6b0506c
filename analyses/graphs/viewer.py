"""resid's own graph viewer: one self-contained HTML page (no network, no libraries) drawing the pruned graph's JSON
(resid.analyses.graphs.export) as an SVG.

Columns are prompt positions (the token under each), rows are layers: token embeddings at the bottom, features and
error nodes (squares) at their layer, logits at the top; the drawing is scaled to fit the window. Edges are lines
whose width follows |weight| (blue positive, red negative). Clicking a node lists its strongest incoming and
outgoing edges and, for a feature with a card (resid.analyses.features.card) given in `cards`, shows the card in a
frame. Given a head split (resid.analyses.graphs.heads), each listed edge names the heads carrying most of it, and
clicking an edge lists its largest parts (the head of its last attention hop, or the residual; the JSON's
LINK_HEADS largest, the rest summed in one row). Given QK summaries (resid.analyses.graphs.qk.QK.summaries), a head
in that list that has one is a link: clicking it shows why the head attended from the edge's target position to
its source position, its score and pattern there, the top pairs (query-side term x key-side term) and the terms
of each side, and the same against the pattern-weighted mean over keys.
"""

import html
import json
from pathlib import Path

from resid.analyses.graphs.export import graph_json
from resid.analyses.graphs.graph import Graph
from resid.analyses.graphs.heads import HeadSplit
from resid.analyses.io import atomic

_SCRIPT = r"""(() => {
const data = JSON.parse(document.getElementById('graph-data').textContent);
const cards = JSON.parse(document.getElementById('graph-cards').textContent);
const qk = data.qk || {};
const position = {};
data.nodes.forEach(n => { position[n.node_id] = n.ctx_idx; });
const svg = document.getElementById('graph');
const info = document.getElementById('info');
const NS = 'http://www.w3.org/2000/svg';
const tokens = data.metadata.prompt_tokens;
const nLayers = Math.max(...data.nodes.map(n => n.layer === 'E' ? 0 : Number(n.layer)));
const colW = 110, rowH = 70, left = 40, top = 30;  // inside the closure: window.top is not shadowed globally
const rowOf = n => n.layer === 'E' ? nLayers + 1 : nLayers - Number(n.layer) + (n.feature_type === 'logit' ? 1 : 0);
const groups = {};
data.nodes.forEach(n => { const k = rowOf(n) + ':' + n.ctx_idx; (groups[k] = groups[k] || []).push(n); });
const where = {};
Object.values(groups).forEach(g => g.forEach((n, i) => {
  where[n.node_id] = [left + n.ctx_idx * colW + (i + 1) * colW / (g.length + 1), top + rowOf(n) * rowH];
}));
const height = top + (nLayers + 3) * rowH;
const width = left + tokens.length * colW + 20;  // drawn in its own units, scaled to fit the window
svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
svg.setAttribute('width', '100%'); svg.setAttribute('height', Math.min(height, 0.85 * window.innerHeight));
const maxW = Math.max(1e-12, ...data.links.map(l => Math.abs(l.weight)));
const edgesOf = {};
data.links.forEach(l => {
  const [x1, y1] = where[l.source], [x2, y2] = where[l.target];
  const line = document.createElementNS(NS, 'line');
  Object.entries({x1, y1, x2, y2, stroke: l.weight > 0 ? '#2166ac' : '#b2182b',
                  'stroke-width': 0.3 + 3 * Math.abs(l.weight) / maxW, 'stroke-opacity': 0.5}).forEach(
    ([k, v]) => line.setAttribute(k, v));
  if (l.heads) { line.setAttribute('class', 'edge'); line.addEventListener('click', () => showEdge(l)); }
  svg.appendChild(line);
  (edgesOf[l.source] = edgesOf[l.source] || []).push(l);
  (edgesOf[l.target] = edgesOf[l.target] || []).push(l);
});
tokens.forEach((t, i) => {
  const label = document.createElementNS(NS, 'text');
  label.setAttribute('x', left + i * colW + colW / 2); label.setAttribute('y', height - 8);
  label.setAttribute('text-anchor', 'middle'); label.textContent = t; svg.appendChild(label);
});
const colour = {'embedding': '#999', 'logit': '#4daf4a', 'mlp reconstruction error': '#ff7f00'};
data.nodes.forEach(n => {
  const [x, y] = where[n.node_id];
  const error = n.feature_type === 'mlp reconstruction error';
  const shape = document.createElementNS(NS, error ? 'rect' : 'circle');
  if (error) { shape.setAttribute('x', x - 5); shape.setAttribute('y', y - 5);
               shape.setAttribute('width', 10); shape.setAttribute('height', 10); }
  else { shape.setAttribute('cx', x); shape.setAttribute('cy', y); shape.setAttribute('r', 6); }
  shape.setAttribute('fill', colour[n.feature_type] || '#984ea3');
  shape.setAttribute('class', 'node'); shape.setAttribute('data-id', n.node_id);
  const title = document.createElementNS(NS, 'title'); title.textContent = n.node_id + ' ' + n.clerp;
  shape.appendChild(title);
  shape.addEventListener('click', () => show(n));
  svg.appendChild(shape);
});
function show(n) {
  const edges = (edgesOf[n.node_id] || []).slice().sort((a, b) => Math.abs(b.weight) - Math.abs(a.weight));
  const rows = edges.slice(0, 12).map(l => `<tr><td>${l.source}</td><td>&rarr;</td><td>${l.target}</td>` +
                                           `<td>${l.weight.toFixed(4)}</td><td>${carriers(l, 3)}</td></tr>`).join('');
  const card = cards[n.node_id] ? `<iframe src="${cards[n.node_id]}" width="100%" height="420"></iframe>` : '';
  info.innerHTML = `<h3>${n.node_id} <small>${n.feature_type}</small></h3>` +
    `<p>layer ${n.layer}, position ${n.ctx_idx}` +
    (n.activation != null ? `, activation ${n.activation.toFixed(4)}` : '') +
    (n.influence != null ? `, cumulative influence ${n.influence.toFixed(4)}` : '') + ` ${n.clerp}</p>` +
    `<table>${rows}</table>${card}`;
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
"""


def page(graph: Graph, node_threshold: float = 0.8, edge_threshold: float = 0.98,
         cards: dict[str, str] | None = None, heads: HeadSplit | None = None, qk: dict | None = None) -> str:
    """The viewer page of `graph` pruned at the thresholds; `cards` maps a feature's node_id ("L_F_P") to the path
    (relative to the page) of its card; `heads` splits its edges by head (graphs.split_heads of graph.pruned() at
    the same thresholds); `qk`: QK.summaries of the heads that carry them (e.g. of heads.carriers())."""
    data = graph_json(graph, graph.model_name, node_threshold, edge_threshold,
                      decode=dict(zip(graph.logit_tokens.tolist(), graph.logit_strs, strict=True)).get, heads=heads,
                      qk=qk)
    meta = data["metadata"]["resid"]
    title = html.escape(f"{graph.model_name}: {''.join(graph.token_strs)!r}")
    summary = html.escape(f"{len(data['nodes'])} nodes, {len(data['links'])} edges (node threshold {node_threshold},"
                          f" edge threshold {edge_threshold}); replacement score {meta['replacement_score']:.3f}, "
                          f"completeness score {meta['completeness_score']:.3f}")

    def embedded(value) -> str:  # JSON inside <script>: "</" must not close the tag
        return json.dumps(value).replace("</", "<\\/")

    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title><style>"
            "body{font-family:sans-serif;margin:12px} #wrap{overflow:auto;border:1px solid #ddd} "
            ".node,.edge{cursor:pointer} text{font-size:12px} td{padding:0 6px;font-family:monospace}"
            "</style></head><body>"
            f"<h2>{title}</h2><p>{summary}</p><div id='wrap'><svg id='graph' xmlns='http://www.w3.org/2000/svg'>"
            f"</svg></div><div id='info'><p>Click a node{'' if heads is None else ' or an edge'}.</p></div>"
            f"<script type='application/json' id='graph-data'>{embedded(data)}</script>"
            f"<script type='application/json' id='graph-cards'>{embedded(cards or {})}</script>"
            f"<script>{_SCRIPT}</script></body></html>")


def write_html(graph: Graph, path: str | Path, node_threshold: float = 0.8, edge_threshold: float = 0.98,
               cards: dict[str, str] | None = None, heads: HeadSplit | None = None, qk: dict | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write(path, page(graph, node_threshold, edge_threshold, cards, heads, qk))
    return path
