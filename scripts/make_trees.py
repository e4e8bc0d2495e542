"""Grow draft-tree templates from measured acceptance rates.

    python -m scripts.make_trees RUN_DIR [--out data/trees]

RUN_DIR is a Token Recycling run (any tree; ``tree=probe`` measures every rank at
every depth up to 8). From its ``summary.json`` this estimates ``p[d][r]``, the
chance that a draft of rank r at depth d is correct given that its parent is,
then grows with ``methods.tree.grow_tree`` the templates of the tree-shape
ablation: 30 to 90 drafts at depth 6, and depth 4 to 8 at 80 drafts.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from evaluation.records.answers import SUMMARY
from methods.autotree import acceptance_table, expected_length
from methods.common import HarnessError, exit_on_error
from methods.tree import TEMPLATES, grow_tree, load_template

BREADTHS = (30, 45, 60, 75, 90)  # drafts, at depth 6
DEPTHS = (4, 5, 6, 7, 8)  # at 80 drafts


@exit_on_error
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", help="a TR run folder (its summary.json holds the node statistics)")
    ap.add_argument("--out", default=str(TEMPLATES))
    args = ap.parse_args(argv)
    summary_file = Path(args.run) / SUMMARY
    if not summary_file.is_file():
        raise HarnessError(f"no {SUMMARY} in {args.run}; give the folder of a finished TR run")
    summary = json.loads(summary_file.read_text())
    state = summary.get("method_state", {})
    if "node_accepts" not in state:
        raise HarnessError(f"{summary_file} is not a Token Recycling run (no node statistics)")
    p = acceptance_table(state["tree_parents"], state["node_accepts"], k=state["k"])
    print("p[depth][rank]:")
    for d, row in enumerate(p, start=1):
        print(f"  depth {d}: " + " ".join(f"{x:.3f}" for x in row))
    source = {"run": str(args.run), "model": summary.get("model"), "bench": summary.get("config", {}).get("bench"),
              "steps": state["node_accepts"][0], "accept": [[round(x, 4) for x in row] for row in p]}
    paper = load_template("paper")
    print(f"paper: 80 drafts, depth 6, expected accepted drafts "
          f"{expected_length(p, paper) - 1:.2f}")
    out = Path(args.out)
    shapes = [(n, 6) for n in BREADTHS] + [(80, d) for d in DEPTHS]
    for n, d in shapes:
        tree = grow_tree(p, n, d, state["k"], reach_depth=True)
        name = f"grown-n{n}-d{d}"
        expected = expected_length(p, tree) - 1
        (out / f"{name}.json").write_text(json.dumps({
            "name": name,
            "description": f"{n} drafts, depth {d}, grown by scripts/make_trees.py: the rank-0 path to depth {d}, "
                           f"then the nodes with the largest estimated chance of acceptance (expected accepted "
                           f"drafts per step {expected:.2f})",
            "source": source,
            "parents": list(tree.parents),
        }) + "\n")
        print(f"{name}: {tree.size - 1} drafts, depth {tree.max_depth}, per depth "
              f"{torch.bincount(tree.depth).tolist()[1:]}, expected accepted drafts {expected:.2f}")


if __name__ == "__main__":
    main()
