// hookscope's browser view: plain JavaScript over the server's /v1 API (no framework, no
// network beyond this server). One run generates from the prompt, then draws the tokens with
// each step's top predictions, the attention patterns, the logit lens and, with a dictionary
// attached, the features per token. The patching form runs a sweep and draws it.

const $ = (id) => document.getElementById(id);

// The bearer token, when the server wants one: from `#token=...` in the address (never sent
// to the server as part of a URL) or typed into the page, kept for this tab only.
const fragment = new URLSearchParams(location.hash.slice(1));
if (fragment.has("token")) sessionStorage.setItem("hookscope-token", fragment.get("token"));

class ApiError extends Error {}

async function api(path, body) {
  const headers = { "Content-Type": "application/json" };
  const token = sessionStorage.getItem("hookscope-token");
  if (token) headers.Authorization = `Bearer ${token}`;
  const answer = await fetch(path, body === undefined
    ? { headers }
    : { method: "POST", headers, body: JSON.stringify(body) });
  const json = await answer.json().catch(() => ({ error: `HTTP ${answer.status}` }));
  if (answer.status === 401) $("token-box").hidden = false;
  if (!answer.ok) throw new ApiError(`${path}: ${json.error ?? answer.status}`);
  return json;
}

function setStatus(text, state, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
  document.body.dataset.state = state;
}

function element(tag, attributes = {}, text) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

// 0..1 to a white-to-blue shade; -1..1 to red-white-blue.
const sequential = (v) => `rgb(${255 - 200 * v}, ${255 - 150 * v}, 255)`;
function diverging(v) {
  const t = Math.max(-1, Math.min(1, v));
  return t >= 0
    ? `rgb(${255 - 200 * t}, ${255 - 150 * t}, 255)`
    : `rgb(255, ${255 + 170 * t}, ${255 + 170 * t})`;
}

let model = null;

async function loadModel() {
  model = await api("/v1/model");
  const dictionaries = model.dictionaries.length
    ? `, ${model.dictionaries.length} dictionar${model.dictionaries.length === 1 ? "y" : "ies"}`
    : "";
  $("model-info").textContent =
    `${model.architecture}: ${model.layers} layers, hidden ${model.hidden}, vocabulary ${model.vocab}, ${model.dtype}${dictionaries}`;
  $("features").hidden = model.dictionaries.length === 0;
}

// --- the prompt, its generation and each step's predictions ---

function drawTokens(strip, tokens, promptLength, onHover) {
  strip.replaceChildren();
  tokens.forEach((text, position) => {
    const span = element("span", {
      class: position >= promptLength ? "token generated" : "token",
      "data-position": position,
      title: `position ${position}`,
    }, text);
    if (onHover) {
      span.addEventListener("mouseenter", () => onHover(position));
      span.addEventListener("mouseleave", () => onHover(null));
    }
    strip.append(span);
  });
}

function drawPredictions(steps, tokens, promptLength) {
  const table = element("table", { class: "predictions" });
  steps.forEach((step) => {
    const row = element("tr");
    const position = promptLength + step.step - 1;
    row.append(element("td", {}, step.step === 0
      ? "after the prompt"
      : `after ${JSON.stringify(tokens[position] ?? "")}`));
    for (const candidate of step.top_next_tokens) {
      const cell = element("td");
      cell.append(element("span", { class: "bar", style: `width:${Math.round(candidate.probability * 40)}px` }));
      cell.append(` ${JSON.stringify(candidate.token)} ${candidate.probability.toFixed(3)}`);
      row.append(cell);
    }
    table.append(row);
  });
  $("predictions").replaceChildren(table);
}

// --- attention: a layers x heads grid of patterns; one head enlarged ---

let attention = null;

function paintPattern(canvas, pattern, scale, highlight) {
  const queries = pattern.length;
  const keys = queries ? pattern[0].length : 0;
  canvas.width = keys * scale;
  canvas.height = queries * scale;
  const context = canvas.getContext("2d");
  pattern.forEach((row, q) => row.forEach((p, k) => {
    context.fillStyle = sequential(p);
    context.fillRect(k * scale, q * scale, scale, scale);
  }));
  if (highlight !== null && highlight !== undefined && highlight < queries) {
    context.strokeStyle = "#e8590c";
    context.lineWidth = Math.max(1, scale / 4);
    context.strokeRect(0, highlight * scale, keys * scale, scale);
  }
}

function drawAttention(answer, promptLength) {
  attention = answer;
  const grid = $("attention-grid");
  grid.replaceChildren();
  const heads = Math.max(0, ...answer.layers.map((layer) => layer.heads.length));
  grid.style.gridTemplateColumns = `4rem repeat(${heads}, 76px)`;
  grid.append(element("span"));
  for (let head = 0; head < heads; head++) grid.append(element("span", { class: "grid-label" }, `head ${head}`));
  for (const layer of answer.layers) {
    grid.append(element("span", { class: "grid-label" }, `layer ${layer.layer}`));
    layer.heads.forEach((pattern, head) => {
      const canvas = element("canvas", {
        class: "head-cell", "data-layer": layer.layer, "data-head": head,
        title: `layer ${layer.layer} head ${head}`,
      });
      paintPattern(canvas, pattern, 4, null);
      canvas.addEventListener("click", () => focusHead(layer.layer, head));
      grid.append(canvas);
    });
  }
  drawTokens($("attention-tokens"), answer.tokens, promptLength, hoverQuery);
  if (answer.layers.length && heads) focusHead(answer.layers[0].layer, 0);
}

let focused = null;

function focusHead(layer, head) {
  focused = { layer, head };
  $("attention-focus").hidden = false;
  $("attention-focus-title").textContent = `layer ${layer} head ${head}`;
  paintFocus(null);
}

function focusedPattern() {
  if (!attention || !focused) return null;
  return attention.layers.find((l) => l.layer === focused.layer)?.heads[focused.head] ?? null;
}

function paintFocus(query) {
  const pattern = focusedPattern();
  if (!pattern) return;
  const scale = Math.max(4, Math.floor(360 / Math.max(1, pattern.length)));
  paintPattern($("attention-focus-canvas"), pattern, scale, query);
}

// Hovering query token `position` shades every token by how much it is attended to from there
// (in the enlarged head) and marks that row in every cell of the grid.
function hoverQuery(position) {
  const pattern = focusedPattern();
  const spans = $("attention-tokens").querySelectorAll(".token");
  spans.forEach((span, key) => {
    const weight = position === null || !pattern ? 0 : pattern[position][key];
    span.style.background = position === null ? "" : sequential(weight);
    span.classList.toggle("selected", key === position);
  });
  for (const canvas of document.querySelectorAll(".head-cell")) {
    const layer = attention.layers.find((l) => l.layer === Number(canvas.dataset.layer));
    paintPattern(canvas, layer.heads[Number(canvas.dataset.head)], 4, position);
  }
  paintFocus(position);
}

// --- the logit lens: layers down, positions across ---

function drawLens(answer) {
  const table = $("lens-table");
  table.className = "heat";
  table.replaceChildren();
  const head = element("tr");
  head.append(element("th"));
  answer.tokens.forEach((token) => head.append(element("th", {}, JSON.stringify(token))));
  table.append(head);
  for (const layer of answer.layers) {
    const row = element("tr", { class: "lens-row" });
    row.append(element("th", {}, `layer ${layer.layer}`));
    for (const position of layer.positions) {
      const best = position.top[0];
      row.append(element("td", {
        class: "lens-cell",
        style: `background:${sequential(best.prob)}`,
        title: position.top.map((t) => `${JSON.stringify(t.token)} ${t.prob.toFixed(3)}`).join("\n"),
      }, JSON.stringify(best.token)));
    }
    table.append(row);
  }
}

// --- features per token ---

function drawFeatures(answer) {
  const body = $("features-body");
  body.replaceChildren();
  for (const dictionary of answer.dictionaries) {
    body.append(element("h3", {}, `${dictionary.site}: ${dictionary.width} features, L0 ${dictionary.l0.toFixed(1)}, variance unexplained ${dictionary.fraction_unexplained.toFixed(3)}`));
    const table = element("table", { class: "feature-table" });
    for (const token of dictionary.tokens) {
      const row = element("tr", { class: "feature-row" });
      row.append(element("td", {}, JSON.stringify(token.token)));
      row.append(element("td", {}, token.features
        .map((f) => `#${f.index} ${f.activation.toFixed(2)}`).join("   ")));
      table.append(row);
    }
    body.append(table);
  }
}

// --- one run: generate, then analyse the whole sequence ---

async function runPrompt(event) {
  event?.preventDefault();
  setStatus("running…", "running");
  try {
    const prompt = $("prompt").value;
    const newTokens = Number($("new-tokens").value);
    const top = Number($("top").value);
    let ids;
    let steps = [];
    let promptLength;
    if (newTokens > 0) {
      const generation = await api("/v1/run", {
        prompts: [prompt], max_new_tokens: newTokens, greedy: true, top,
      });
      const row = generation.prompts[0];
      ids = row.input_ids.concat(row.new_ids);
      steps = row.steps;
      promptLength = row.input_ids.length;
    } else {
      const trace = await api("/v1/run", { prompts: [prompt], top });
      const row = trace.prompts[0];
      ids = row.input_ids;
      steps = [{ step: 0, top_next_tokens: row.top_next_tokens }];
      promptLength = ids.length;
    }
    const lens = await api("/v1/lens", { input_ids: ids, top_k: 3 });
    drawTokens($("tokens"), lens.tokens, promptLength);
    drawPredictions(steps, lens.tokens, promptLength);
    drawLens(lens);
    try {
      drawAttention(await api("/v1/attention", { input_ids: ids }), promptLength);
    } catch (error) {
      // A model without softmax attention (Mamba) has no patterns to draw.
      $("attention-grid").replaceChildren(element("p", {}, error.message));
    }
    if (model.dictionaries.length) drawFeatures(await api("/v1/features", { input_ids: ids }));
    setStatus(`${ids.length} tokens`, "done");
  } catch (error) {
    setStatus(error.message, "error", true);
  }
}

// --- activation patching ---

async function runPatch(event) {
  event.preventDefault();
  setStatus("patching…", "running");
  try {
    const sweep = await api("/v1/patch", {
      clean: $("patch-clean").value,
      corrupt: $("patch-corrupt").value,
      metric: $("patch-metric").value,
      site: $("patch-site").value,
    });
    const table = $("patch-table");
    table.className = "heat";
    table.replaceChildren();
    const caption = element("caption", {},
      `${sweep.metric}: clean ${sweep.clean.toFixed(3)}, corrupt ${sweep.corrupt.toFixed(3)}`);
    table.append(caption);
    const head = element("tr");
    head.append(element("th"));
    sweep.positions.forEach((label) => head.append(element("th", {}, JSON.stringify(label))));
    table.append(head);
    for (const site of sweep.sites) {
      const row = element("tr", { class: "patch-row" });
      row.append(element("th", {}, site.site));
      for (const score of site.scores) {
        row.append(element("td", { class: "patch-cell", style: `background:${diverging(score)}` },
          score.toFixed(2)));
      }
      table.append(row);
    }
    setStatus(`patched ${sweep.sites.length} sites`, "patched");
  } catch (error) {
    setStatus(error.message, "error", true);
  }
}

$("token-save").addEventListener("click", async () => {
  sessionStorage.setItem("hookscope-token", $("token").value);
  $("token-box").hidden = true;
  await start();
});
$("prompt-form").addEventListener("submit", runPrompt);
$("patch-form").addEventListener("submit", runPatch);

async function start() {
  try {
    await loadModel();
    setStatus("ready", "ready");
  } catch (error) {
    setStatus(error.message, "error", true);
  }
}

start();
