"""report.html (evaluation.reporting.html) on a tiny result set, opened in a real headless Chromium: its script runs without
an error, its main table holds the markdown table's cells, and each generated token is one element marked by its
step."""
import json
import re
import shutil
import subprocess
from collections import defaultdict
from html.parser import HTMLParser

import pytest
from omegaconf import OmegaConf

import evaluation.reporting.html
from evaluation import report as rp
from evaluation.records.equality import NEAR_TIE
from evaluation.reporting.collect import _tokenizer
from methods.common import ROOT
from tests.test_report import rec, write_run

MODEL = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "model" / "smollm2-135m.yaml"))
TEXTS = {1: ("qa", ["The capital of France is Paris."]),
         2: ("rag", ["Speculative decoding drafts tokens, and the target checks them.", "Then it accepts them."])}
WHY = "logits 11.5000 (token 1, rank 1) and 11.4999 (token 2, rank 2): a test's near-tie"


def answer(tok, qid: int, chunks: list[int], prefill: bool, nodes: int, seconds: float, change: int | None = None):
    """Question ``qid``'s answer (``TEXTS``, end token included) in steps whose accept lengths cycle through
    ``chunks`` (after a prefill step of one token where ``prefill``), each drafting ``nodes`` nodes; ``change``: the
    first turn's token at that position replaced (a divergence)."""
    category, texts = TEXTS[qid]
    ids = [tok(t, add_special_tokens=False).input_ids + [tok.eos_token_id] for t in texts]
    if change is not None:
        ids[0][change] += 1
    steps = []
    for turn in ids:
        left, s = len(turn), [1] if prefill else []
        left -= sum(s)
        while left:
            s.append(min(chunks[len(s) % len(chunks)], left))
            left -= s[-1]
        steps.append(s)
    r = rec(qid, category, sum(map(len, ids)), seconds, [a for s in steps for a in s])
    r["choices"][0].update(turns=[tok.decode(t) for t in ids], token_ids=ids, decoding_steps=[len(s) for s in steps],
                           new_tokens=[len(t) for t in ids], wall_time=[seconds / len(ids)] * len(ids),
                           prefill_step=[prefill] * len(ids),
                           draft_nodes=[0 if prefill and i == 0 else nodes for s in steps for i in range(len(s))])
    return r


class Page(HTMLParser):
    """What a page shows: the text of every table cell, and the token elements of each answer (its section's
    data-row) as (class, title) in order."""

    def __init__(self, dom: str):
        super().__init__()
        self.row, self.tokens, self.cells, self.cell = None, defaultdict(list), [], None
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.row = a.get("data-row")
        elif tag == "span" and self.row and "tok" in a.get("class", "").split():
            self.tokens[self.row].append((a["class"], a.get("title", "")))
        elif tag == "td":
            self.cell = ""

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data

    def handle_endtag(self, tag):
        if tag == "td":
            self.cells.append(self.cell)
            self.cell = None


@pytest.mark.slow  # a browser
def test_report_page_in_chromium(tmp_path, monkeypatch):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("chromium is not installed: make test installs it (make browser: apt-get install chromium)")
    tok = _tokenizer(json.dumps(MODEL, sort_keys=True))
    runs = {"vanilla": [answer(tok, q, [1], True, 0, 2.0) for q in TEXTS],
            "tr": [answer(tok, q, [3, 1, 2, 4], False, 8, 1.0) for q in TEXTS],
            "pld": [answer(tok, q, [2], True, 5, 1.5, change=4 if q == 2 else None) for q in TEXTS]}
    for method, records in runs.items():
        write_run(tmp_path / "runs" / method, method, records)
        OmegaConf.save({"model": MODEL}, tmp_path / "runs" / method / "config.yaml")
    explained = []

    def explain(run, recs, mismatches):  # the model is not re-run here: evaluation.equal's tests do that
        explained.append(run)
        for m in mismatches:
            m.kind, m.why = NEAR_TIE, WHY
        return "float32"

    monkeypatch.setattr(evaluation.reporting.html, "explain", explain)
    out = tmp_path / "out"
    files = rp.report([str(tmp_path / "runs")], out)["files"]
    page = out / "report.html"
    assert page in files and explained == [tmp_path / "runs" / "vanilla"]  # once: only pld diverges
    text = page.read_text()
    assert not re.search(r"""(src|href)=(?!["']?(data:|#))""", text) and "<link" not in text  # nothing fetched
    pngs = [f for f in files if f.suffix == ".png"]
    assert pngs and text.count("src='data:image/png;base64,") == len(pngs)

    p = subprocess.run([chromium, "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={tmp_path / 'c'}",
                        "--enable-logging=stderr", "--v=0", "--dump-dom", f"{page.as_uri()}#q=2"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    console = [line for line in p.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    assert not console, console  # an error of the page's script, or anything it logged
    dom, shown = p.stdout, Page(p.stdout)
    md = (out / "main_table.md").read_text()
    tr_row = next(line for line in md.splitlines() if line.startswith("| tiny-llama | tr |"))
    cells = tr_row.strip("| \n").split(" | ")  # every number, the overall speedup last
    assert len(cells) > 5 and all(cell in shown.cells for cell in cells), (cells, shown.cells)
    assert "Question by question" in dom and "<a href=\"#q=2\">2</a>" in dom and WHY in shown.cells

    tr, record = shown.tokens["tiny-llama · tr"], runs["tr"][1]["choices"][0]
    assert len(tr) == sum(map(len, record["token_ids"]))  # question 2: one element per generated token
    assert sum("bonus" in c for c, _ in tr) == len(record["accept_lengths"])  # one bonus token per step
    assert tr[0] == ("tok acc first", f"turn 1, token 1: step 1 of {record['decoding_steps'][0]}, accept length 3, "
                                      f"draft 8 nodes; drafted, accepted")
    assert [c for c, _ in tr[1:4]] == ["tok acc", "tok bonus", "tok bonus first"]  # steps of 3 and 1
    pld = shown.tokens["tiny-llama · pld"]
    assert "prefill's token" in pld[0][1] and [i for i, (c, _) in enumerate(pld) if "div" in c] == [4]
    assert all(c.startswith("tok bonus first") for c, _ in shown.tokens["tiny-llama · vanilla"])


def test_a_foreign_file_shows_its_text(tmp_path):
    """Spec-Bench's own files have no token ids and no tokenizer: their turns show as text."""
    folder = tmp_path / "model_answer"
    folder.mkdir()
    for name, seconds in (("m-vanilla", 2.0), ("m-tr", 1.0)):
        records = [rec(1, "qa", 10, seconds, [1] * 10, model=name, text=f"answer of {name}")]
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    rp.report([f"tr={folder / 'm-tr.jsonl'}"], tmp_path / "out", baseline=str(folder / "m-vanilla.jsonl"),
              figures=False)
    text = (tmp_path / "out" / "report.html").read_text()
    assert '{"plain":"answer of m-tr"}' in text and '"texts":[]' in text
    assert "· tr: not compared (the files answer with different models" in text
