"""report.html: the whole report on one page that opens anywhere, offline, and shows what the tables only count.

Beside the tables (the same rows of text as the markdown files: ``evaluation.reporting.tables``' ``*_rows``) and the
figures (inlined as base64 PNG), it holds every answer token by token: each generated token is an element marked
by the step that committed it (a draft the target accepted, or the step's bonus token: the target's own, which
ends every step and is all a prefill step yields), its tooltip the step, its accept length and its draft size. So
one can see where a method's drafts land and where they fail, question by question. A turn that is not
token-identical to the baseline shows its first divergence (``evaluation.records.equality.compare``), classified by
re-running the baseline's model only when there is one (``evaluation.running.explain``: normally there is none).
Nothing is fetched: CSS, script and data are in the file; the answers are JSON that the script renders for the
question chosen, so that a report of 480 questions stays small and quick to open.
"""
from __future__ import annotations

import base64
import json
import os
import re
from html import escape
from pathlib import Path

import pandas as pd

from evaluation.records.equality import compare
from evaluation.records.metrics import per_question
from evaluation.reporting.collect import Group, Run, bench_line, environment_line, run_tokenizer
from evaluation.reporting.tables import (
    DEPTH_NOTE,
    DRAFTER_NOTE,
    batch_rows,
    batch_sizes,
    depth_rows,
    drafter_rows,
    main_rows,
)
from evaluation.running.explain import explain
from methods.common import HarnessError, write_text_atomic

WINDOW = 4  # tokens decoded before each token: a character split over byte tokens is at most 4 bytes


def write_html(out: Path, table: pd.DataFrame, stats: pd.DataFrame, groups: list[Group], depths: pd.DataFrame,
               drafters: pd.DataFrame, files: list[Path], notes: list[str], batch: pd.DataFrame | None = None) -> Path:
    """Write ``out/report.html`` from what ``evaluation.reporting.build.report`` made (its PNG ``files`` inlined; ``notes``:
    the lines under its main table; ``batch``: its numbers under load, a table per batch size)."""
    identity, diverged = _identity(groups)
    header, body = main_rows(table)
    sections = [
        ("Main table", _table(header, [[_unbroken_brackets(c) for c in row] for row in body], "main")
         + "".join(f"<p class=note>{escape(n)}</p>" for n in notes)),
        ("Under load", "".join(f"<h3>Batch size {size}</h3>" + _text_table(*batch_rows(batch, size))
                               for size in batch_sizes(batch)) if batch is not None else ""),
        ("Figures", "<div class=figures>" + "".join(
            f"<figure><img alt='{escape(f.stem)}' src='data:image/png;base64,"
            f"{base64.b64encode(f.read_bytes()).decode()}'><figcaption>{escape(f.stem)}</figcaption></figure>"
            for f in files if f.suffix == ".png") + "</div>"),
        ("Acceptance by depth", _text_table(*depth_rows(depths)) + f"<p class=note>{escape(DEPTH_NOTE)}</p>"
         if len(depths) else ""),
        ("Drafters", _text_table(*drafter_rows(drafters)) + f"<p class=note>{escape(DRAFTER_NOTE)}</p>"
         if len(drafters) else ""),
        ("Every number per task", "<details><summary>tasks.csv</summary>" + stats.to_html(
            index=False, border=0, na_rep="-", float_format=lambda x: f"{x:.2f}") + "</details>"),
        ("Token-identical to the baseline", identity),
        ("Question by question", _per_question_tables(groups)),
        ("Answers", "<p><label>Question <select id=question></select></label> <span class='tok acc'>drafted, "
                    "accepted</span> <span class='tok bonus'>bonus token</span> <span class='tok div'>first "
                    "divergence</span> (a step's tokens start at a bar; hover a token for its step)</p>"
                    "<div id=answer></div>"),
    ]
    data = json.dumps(_answers(groups, diverged), ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    page = (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>Report: {escape(bench_line(groups))}"
            f"</title><style>{STYLE}</style></head><body><h1>Report</h1><p>{escape(bench_line(groups))}<br>"
            f"{escape(environment_line(groups))}</p><nav>"
            + " · ".join(f"<a href='#s{i}'>{escape(name)}</a>" for i, (name, html) in enumerate(sections) if html)
            + "</nav>" + "".join(f"<h2 id=s{i}>{escape(name)}</h2>{html}" for i, (name, html) in enumerate(sections)
                                 if html)
            + f"<script type=application/json id=data>{data}</script><script>{SCRIPT}</script></body></html>\n")
    write_text_atomic(out / "report.html", page)
    return out / "report.html"


def _table(header: list[str], rows: list[list[str]], cls: str = "") -> str:
    """A table of ``rows`` given as HTML (escaped by the caller: a cell may be a link)."""
    return (f"<table class='{cls}'><thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr></thead>"
            "<tbody>" + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
            + "</tbody></table>")


def _unbroken_brackets(text: str) -> str:
    """A cell's text as HTML that a narrow window may wrap, but not inside brackets (an interval stays whole)."""
    return re.sub(r"\[[^\]]*\]", lambda m: f"<span class=nw>{m[0]}</span>", escape(text))


def _text_table(header: list[str], body: list[list[str]]) -> str:
    """A table of ``evaluation.reporting.tables`` rows of text as HTML, cell for cell."""
    return _table([h for h in header], [[escape(c) for c in row] for row in body])


def _link(qid) -> str:
    return f"<a href='#q={qid}'>{qid}</a>"


# ---------------------------------------------------------------- token identity

def _identity(groups: list[Group]) -> tuple[str, dict]:
    """The section on token identity (each row's runs against its first baseline run, on their common questions),
    and the first divergence of each (run, question, turn) that has one: {(path, question, turn): position}, for
    the answers' marks."""
    lines, rows, diverged = [], [], {}
    for g in groups:
        if g.is_baseline:
            continue
        base, found = g.baseline[0], run_tokenizer(g.baseline[0].path)
        for run in g.runs:
            common = run.questions & base.questions
            ours, theirs = ([r for r in x.records if r["question_id"] in common] for x in (run, base))
            try:
                same, total, mismatches, unit = compare(theirs, ours)
            except HarnessError as e:
                lines.append(f"{g.model} · {g.label}: not compared ({e})")
                continue
            lines.append(f"{g.model} · {g.label}: {same}/{total} turns identical to {base.label} ({unit}s)"
                         + (f", {run.path}" if len(g.runs) > 1 else ""))
            if mismatches and unit == "token" and any(m.kind is None for m in mismatches):
                try:
                    explain(base.path.parent, theirs, mismatches)
                except HarnessError as e:
                    lines.append(f"divergences not classified: {e}")
            for m in mismatches:  # on common questions only: each has its turn and position
                if unit == "token":
                    diverged[run.path, m.question_id, m.turn] = m.position
                rows.append([escape(f"{g.model} · {g.label}"), _link(m.question_id), str(m.turn), str(m.position),
                             escape(_token(found, m.a)), escape(_token(found, m.b)), escape(m.kind or "-"),
                             escape(m.why)])
    text = "".join(f"<p>{escape(line)}</p>" for line in lines)
    if rows:
        text += _table(["Row", "Question", "Turn", "Position", "Baseline's token", "Its token", "Kind", "Why"], rows,
                       "why")
    return text, diverged


def _token(found, token) -> str:
    """A token id with its text (``<end>`` and the characters of a text comparison as they are)."""
    return f"{token} {found[1].decode([token])!r}" if found and isinstance(token, int) else str(token)


# ---------------------------------------------------------------- question by question

def _per_question(runs: list[Run]) -> pd.DataFrame:
    """Per question over the repeats ``runs``: MAT, mean wall time and tokens/s (``evaluation.records.metrics``)."""
    q = pd.concat([per_question(r.records) for r in runs])
    s = q[["accepted", "steps", "new_tokens", "wall_time"]].groupby(level=0).sum()
    return pd.DataFrame({"task": q.groupby(level=0)["task"].first(), "mat": s["accepted"] / s["steps"],
                         "wall": q.groupby(level=0)["wall_time"].mean(), "tok_per_s": s["new_tokens"] / s["wall_time"]})


def _per_question_tables(groups: list[Group]) -> str:
    """For each row that is not a baseline: per question its MAT and wall time beside its baseline's (sortable)."""
    parts = []
    for g in groups:
        if g.is_baseline:
            continue
        q, b = _per_question(g.runs), _per_question(g.baseline)
        q = q.merge(b, left_index=True, right_index=True, suffixes=("", "_b"))
        rows = [[_link(qid), escape(r["task"]), f"{r['mat_b']:.2f}", f"{r['mat']:.2f}",
                 f"{r['mat'] - r['mat_b']:+.2f}", f"{r['wall_b']:.2f}", f"{r['wall']:.2f}",
                 f"{r['wall'] - r['wall_b']:+.2f}", f"{r['tok_per_s'] / r['tok_per_s_b']:.2f}×"]
                for qid, r in q.iterrows()]
        parts.append(f"<details><summary>{escape(f'{g.model} · {g.label}')} against {escape(g.baseline[0].label)}: "
                     f"{len(rows)} questions (click a column to sort)</summary>"
                     + _table(["Question", "Task", "MAT (baseline)", "MAT", "Δ MAT", "Wall s (baseline)", "Wall s",
                               "Δ wall s", "Speedup"], rows, "sortable") + "</details>")
    return "".join(parts)


# ---------------------------------------------------------------- answers token by token

def _pieces(tokenizer, ids: list[int]) -> list[str]:
    """Each token's text as it reads in the answer: its window of ``WINDOW`` tokens before it decoded with it, less
    that window decoded without it. A SentencePiece word so keeps its leading space, and a character split over
    byte tokens shows as U+FFFD on its first bytes and whole on its last."""
    starts = [max(0, i - WINDOW) for i in range(len(ids))]
    kw = {"clean_up_tokenization_spaces": False}
    with_it = tokenizer.batch_decode([ids[s:i + 1] for i, s in enumerate(starts)], **kw)
    without = tokenizer.batch_decode([ids[s:i] for i, s in enumerate(starts)], **kw)
    return [w[len(os.path.commonprefix([w, o])):] for w, o in zip(with_it, without)]


def _answers(groups: list[Group], diverged: dict) -> dict:
    """The page's data: per question, each row's answer (its first run) turn by turn. A turn is the index of its
    token texts in ``texts`` (shared by the rows that generated the same tokens, as lossless methods do), its
    steps' accept lengths and draft sizes, and its first divergence; or only its text where there are no token ids
    or no tokenizer (a foreign file)."""
    texts, index, questions = [], {}, {}
    for g in groups:
        run, found = g.runs[0], run_tokenizer(g.runs[0].path)
        for r in run.records:
            c, qid = r["choices"][0], r["question_id"]
            q = questions.setdefault(qid, {"id": qid, "category": r.get("category", ""), "answers": []})
            if found is None or "token_ids" not in c:
                q["answers"].append({"row": f"{g.model} · {g.label}", "turns": [{"plain": t} for t in c["turns"]]})
                continue
            turns, at = [], 0
            for i, (ids, n) in enumerate(zip(c["token_ids"], c["decoding_steps"])):
                key = (found[0], tuple(ids))
                if key not in index:
                    index[key] = len(texts)
                    texts.append(_pieces(found[1], ids))
                turn = {"text": index[key], "diverges": diverged.get((run.path, qid, i + 1))}
                steps = c["accept_lengths"][at:at + n]
                if sum(steps) == len(ids):  # else a record that does not say which step made which token
                    turn.update(steps=steps, nodes=c.get("draft_nodes", [None] * len(c["accept_lengths"]))[at:at + n],
                                prefill=bool(c.get("prefill_step", [False] * (i + 1))[i]))
                turns.append(turn)
                at += n
            q["answers"].append({"row": f"{g.model} · {g.label}", "turns": turns})
    return {"texts": texts, "questions": sorted(questions.values(), key=lambda q: q["id"])}


STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}
th,td{border-bottom:1px solid #ddd;padding:2px 8px;text-align:right;white-space:nowrap}
th:nth-child(-n+2),td:nth-child(-n+2){text-align:left}
table.why td:last-child,table.main td{white-space:normal}table.why td:last-child{text-align:left}
table.main td:nth-child(-n+2),.nw{white-space:nowrap}
table.sortable th{cursor:pointer;background:#f4f4f4}
.figures{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:1em}
figure{margin:0}figure img{width:100%}figcaption{font-size:12px;color:#666;text-align:center}
.note{color:#555;font-size:13px}
.answer h3{margin:.8em 0 .2em;font-size:15px}
.turn{white-space:pre-wrap;font:13px/1.9 ui-monospace,monospace;border-left:3px solid #ccc;padding-left:.6em;
margin:.3em 0}
.tok.acc{background:#c9efc9}.tok.bonus{background:#ffe2a6}.tok.first{border-left:2px solid #555}
.tok.div{outline:2px solid #d00}
"""

# Renders the chosen question (#q=ID in the address, so a question can be linked) and sorts the tables on a click.
SCRIPT = """
const D = JSON.parse(document.getElementById('data').textContent);
const select = document.getElementById('question');
for (const q of D.questions) select.add(new Option(q.id + ' (' + q.category + ')', q.id));
select.onchange = () => { location.hash = 'q=' + select.value; };

function turn(t, n) {
  const div = document.createElement('div');
  div.className = 'turn';
  if (t.plain !== undefined) { div.textContent = t.plain; return div; }
  const spans = D.texts[t.text].map(piece => {
    const span = document.createElement('span');
    span.className = 'tok';
    span.textContent = piece;
    return span;
  });
  let i = 0;
  (t.steps || []).forEach((a, s) => {
    for (let j = 0; j < a; j++, i++) {
      const bonus = j === a - 1, what = t.prefill && s === 0 ? "the prefill's token" :
        bonus ? "bonus token (the target's own)" : 'drafted, accepted';
      spans[i].classList.add(bonus ? 'bonus' : 'acc');
      if (j === 0) spans[i].classList.add('first');
      spans[i].title = 'turn ' + n + ', token ' + (i + 1) + ': step ' + (s + 1) + ' of ' + t.steps.length +
        ', accept length ' + a + (t.nodes[s] === null ? '' : ', draft ' + t.nodes[s] + ' nodes') + '; ' + what;
    }
  });
  if (t.diverges !== null && spans[t.diverges]) {
    spans[t.diverges].classList.add('div');
    spans[t.diverges].title += '; first divergence from the baseline';
  }
  div.append(...spans);
  return div;
}

function show() {
  const id = location.hash.startsWith('#q=') ? location.hash.slice(3) : '';
  const q = D.questions.find(q => String(q.id) === id) || D.questions[0];
  select.value = q.id;
  const box = document.getElementById('answer');
  box.replaceChildren();
  for (const a of q.answers) {
    const section = document.createElement('section'), h = document.createElement('h3');
    section.className = 'answer';
    section.dataset.row = a.row;
    h.textContent = a.row;
    section.append(h, ...a.turns.map((t, k) => turn(t, k + 1)));
    box.append(section);
  }
}
window.onhashchange = () => {  // a question's link or the selector; the section links leave the question as it is
  if (location.hash.startsWith('#q=')) { show(); select.closest('p').scrollIntoView(); }
};
show();

for (const th of document.querySelectorAll('table.sortable th')) th.onclick = () => {
  const body = th.closest('table').tBodies[0], col = th.cellIndex, up = th.dataset.up !== '1';
  th.dataset.up = up ? '1' : '0';
  const key = row => { const text = row.cells[col].textContent, x = parseFloat(text); return isNaN(x) ? text : x; };
  body.append(...[...body.rows].sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0) * (up ? 1 : -1)));
};
"""
