// resid's attention-pattern view (resid.analyses.attention_view): one layer's heads over one prompt's tokens.
// Reads the JSON in <script id="attention-data">: {title, tokens, heads, layer, patterns[head][query][key]}.
// Each view on a page lives in its own element (data-view), so a notebook can show several.
(() => {
  const views = document.querySelectorAll('[data-attention-view]:not([data-drawn])');
  views.forEach(root => {
    root.setAttribute('data-drawn', '1');
    const data = JSON.parse(root.querySelector('script.attention-data').textContent);
    draw(root, data);
  });

  function colour(p) {  // white to the blue of resid's figures, by probability
    const t = Math.max(0, Math.min(1, p));
    const r = Math.round(255 + (33 - 255) * t), g = Math.round(255 + (102 - 255) * t);
    const b = Math.round(255 + (172 - 255) * t);
    return `rgb(${r},${g},${b})`;
  }

  function heatmap(canvas, pattern, cell) {
    const n = pattern.length;
    canvas.width = n * cell;
    canvas.height = n * cell;
    const ctx = canvas.getContext('2d');
    for (let q = 0; q < n; q++) {
      for (let k = 0; k < n; k++) {
        ctx.fillStyle = colour(pattern[q][k]);
        ctx.fillRect(k * cell, q * cell, cell, cell);
      }
    }
  }

  function draw(root, data) {
    const n = data.tokens.length;
    const thumbs = root.querySelector('.thumbs');
    const big = root.querySelector('canvas.big');
    const text = root.querySelector('.text');
    const readout = root.querySelector('.readout');
    const title = root.querySelector('.selected');
    let head = 0;      // index into data.heads
    let pinned = null; // a query position clicked in the text, or null

    data.heads.forEach((h, i) => {
      const box = document.createElement('div');
      box.className = 'thumb';
      box.dataset.head = String(h);
      const canvas = document.createElement('canvas');
      heatmap(canvas, data.patterns[i], Math.max(1, Math.floor(96 / n)));
      const label = document.createElement('div');
      label.textContent = `head ${h}`;
      box.append(canvas, label);
      box.addEventListener('click', () => select(i));
      thumbs.append(box);
    });

    const spans = data.tokens.map((token, pos) => {
      const span = document.createElement('span');
      span.className = 'token';
      span.dataset.pos = String(pos);
      span.textContent = token;
      span.title = `position ${pos}`;
      span.addEventListener('mouseenter', () => { if (pinned === null) focus(pos); });
      span.addEventListener('mouseleave', () => { if (pinned === null) focus(null); });
      span.addEventListener('click', () => { pinned = pinned === pos ? null : pos; focus(pinned); });
      text.append(span);
      return span;
    });

    const cell = Math.max(4, Math.min(24, Math.floor(480 / n)));
    big.addEventListener('mousemove', event => {
      const rect = big.getBoundingClientRect();
      const k = Math.floor((event.clientX - rect.left) / cell), q = Math.floor((event.clientY - rect.top) / cell);
      if (q < 0 || k < 0 || q >= n || k >= n) return;
      const p = data.patterns[head][q][k];
      readout.textContent = `query ${q} ${JSON.stringify(data.tokens[q])} reads key ${k} ` +
        `${JSON.stringify(data.tokens[k])} with probability ${p.toFixed(4)}`;
    });

    // the text coloured by where one query position reads (its row of the selected head's pattern)
    function focus(query) {
      spans.forEach((span, pos) => {
        const p = query === null ? 0 : data.patterns[head][query][pos];
        span.style.background = query === null ? '' : colour(p);
        span.style.color = p > 0.6 ? '#ffffff' : '';
        span.classList.toggle('query', pos === query);
        span.dataset.p = query === null ? '' : p.toFixed(4);
      });
      readout.textContent = query === null ? 'hover over (or click) a token to see where it reads' :
        `${JSON.stringify(data.tokens[query])} (position ${query}) reads, in head ${data.heads[head]}: ` +
        data.tokens.map((t, pos) => [t, pos, data.patterns[head][query][pos]])
          .filter(x => x[1] <= query || x[2] > 0).sort((a, b) => b[2] - a[2]).slice(0, 3)
          .map(x => `${JSON.stringify(x[0])}@${x[1]} ${x[2].toFixed(3)}`).join(', ');
    }

    function select(i) {
      head = i;
      heatmap(big, data.patterns[i], cell);
      thumbs.querySelectorAll('.thumb').forEach((box, j) => box.classList.toggle('on', j === i));
      title.textContent = `layer ${data.layer}, head ${data.heads[i]}: rows are queries, columns keys`;
      focus(pinned);
    }

    select(0);
  }
})();
