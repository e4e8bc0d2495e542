"""Token Recycling (Luo et al., arXiv 2408.08696): draft from recycled top-K successors.

State: an adjacency matrix ``M`` of shape ``[vocab, K]``; row ``t`` holds the K
most likely successors of token ``t`` the last time the target verified a node
holding ``t``. Each step:

* **draft** by filling a static tree template breadth-first: the node reached
  by rank path ``p + [r]`` gets ``M[token(p), r]``; one gather per depth;
* the shared verifier checks the tree and accepts the longest greedy path;
* **update** ``M[token(v)] = top-K(logits at v)`` for every verified node
  ``v`` (root, accepted and rejected drafts) in one scatter. Where a token sits
  at several nodes of one step the last node in breadth-first order wins.

Worked example, K=2, tree (-1, 0, 0, 1) (root with ranks 0 and 1 below it, and
rank 0 under the first child), root token 5, ``M[5] = [7, 3]``, ``M[7] = [9, 4]``::

    depth 1: nodes 1, 2 <- M[5, 0], M[5, 1] = 7, 3
    depth 2: node 3     <- M[7, 0]          = 9         draft tokens [5, 7, 3, 9]

Start policies (``start``): ``hot`` (the paper: M carries over warm-up, turns
and questions), ``cold`` (M zeroed at every question), ``prompt`` (zeroed at
every question, then every turn's prompt seeds the rows of its tokens from the
prefill logits, in prompt order, later positions winning) and ``hot_prompt`` (M
carries over, and every turn's prompt seeds its rows: SAM-Decoding's Token
Recycling, which updates from the prefill's logits too).

Following the reference code (Luowaterbi/TokenRecycling, ``evaluation/inference_recycling.py``,
``recycling_forward``): the prefill covers the prompt but its last token, so the first step
is a full tree rooted at the prompt's last token, which can accept several tokens and
writes every node's row (``first_step=tree``, via the loop's ``drafts_first``);
``first_step=prefill`` lets the prefill yield the first token instead.

Where a request ends, we differ unless ``reference=true``. The reference's loop (commit 1b4c05c,
``evaluation/inference_recycling.py`` lines 99-137) keeps each forward's bonus token pending as the next
root and appends the root and accepted drafts to the sequence (lines 117-126); it leaves the loop, before
the update of lines 131-132, when those hold the EOS token or when the sequence, the pending bonus left
out, holds more than ``max_new_tokens`` new tokens (line 128): once ``max_new_tokens + 2`` exist, counting
the bonus. A bonus that is EOS ends it after the update (lines 134-137). So it forwards once or twice past
the budget, learning from all those forwards but the last, and never learns from a forward that ends it on
the count or on an accepted EOS. Within a request none of this changes a token or an accept length; under
a hot start it changes the matrix the next request starts from. ``reference=true`` does the same through
the loop's ``Proposer.ending`` (``methods.decode``), whose forwards past the answer emit, time and count
no answer token; the default ends with the answer and learns from its last forward.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from methods.base import Draft, Ending, Preparation, Proposer, Verification, register
from methods.calibrate import auto_tree
from methods.common import HarnessError
from methods.params import param
from methods.tree import Tree, TreeError, load_template

STARTS = ("hot", "cold", "prompt", "hot_prompt")
SEEDED = ("prompt", "hot_prompt")  # the starts that write the prompt's rows from its prefill logits
FIRST_STEPS = ("tree", "prefill")
AUTO = "auto"  # method.tree=auto: the tree chosen for this engine and device (methods.autotree)
REFERENCE_ENDING = Ending(past=2, learns_last=False, stops_on_bonus=True)  # inference_recycling.py lines 128-137


def fit_tree(tree: Tree, k: int) -> Tree:
    """The rule the K ablation uses to adapt a template to K columns.

    K below the template's width: drop every node of rank >= K with its subtree.
    K above it: every node that uses the template's full width (the paper tree's
    root and its first node at depths 2 and 3) gets K children, the new ones leaves.
    """
    counts = tree.children_counts()
    width = max(counts)
    if k == width:
        return tree
    # Rebuild level by level (so the result is breadth-first): keep nodes of rank < k under kept parents.
    parents, new_index, frontier = [-1], {0: 0}, [0]
    while frontier:
        nxt = []
        for old in frontier:
            kids = [i for i, p in enumerate(tree.parents) if p == old][:k]
            for child in kids:
                new_index[child] = len(parents)
                parents.append(new_index[old])
            extra = k - len(kids) if counts[old] == width and k > width else 0
            parents.extend([new_index[old]] * extra)
            nxt.extend(kids)
        frontier = nxt
    return Tree.from_parents(parents)


@register
class TokenRecycling(Proposer):
    name = "tr"
    resumes_mid_request = True

    @dataclass
    class Params:
        k: int = param(8, "columns of the adjacency matrix: successors kept per token", low=1, high=1024)
        tree: str = param("paper", "a template in data/trees/ (paper = 2.2.2: 80 drafts, depth 6), a .json path, "
                          "or auto (chosen for this engine and device: methods/autotree.py)")
        start: str = param("hot", "hot (paper: M carries across warm-up, turns, questions) | cold (zeros per "
                           "question) | prompt (zeros per question, seeded from prompt logits) | hot_prompt (carries "
                           "over and seeded from prompt logits: SAM-Decoding's TR)", choices=STARTS)
        fit_tree_to_k: bool = param(False, "true: clip ranks >= k from the tree, or widen full-width nodes to k "
                                    "(the K ablation's rule)")
        first_step: str = param("tree", "tree (the reference: the prefill leaves out the prompt's last token, "
                                "whose tree is the first step) | prefill (the prefill yields the first token)",
                                choices=FIRST_STEPS)
        reference: bool = param(False, "true: end each request as the reference code does, forwarding past the "
                                "answer until max_new_tokens + 2 tokens exist and learning from all those forwards "
                                "but the last (the next request's matrix; the answer is the same)")

    def __init__(self, vocab_size: int, k: int, tree: Tree, tree_name: str, start: str, device: torch.device,
                 first_step: str, reference: bool = False):
        self.k, self.start, self.tree_name, self.device = k, start, tree_name, device
        self.memory = "question" if start in ("cold", "prompt") else "run"  # the matrix: zeroed per question, or not
        self.first_step, self.reference = first_step, reference
        self.ending = REFERENCE_ENDING if reference else None
        self.drafts_first = first_step == "tree"  # the reference's prefill: the prompt but its last token
        self.topk = k  # the verifier hands back every node's top-K: the update needs nothing else
        self.wants_prompt_logits = start in SEEDED
        # int16 holds ids below 32768 (Llama-2/Vicuna's 32000); larger vocabularies take int32.
        dtype = torch.int16 if vocab_size <= torch.iinfo(torch.int16).max + 1 else torch.int32
        self.M = torch.zeros(vocab_size, k, dtype=dtype, device=device)  # [vocab, K]
        self.auto: dict | None = None  # tree=auto: how the tree was chosen (methods.autotree.choose_tree)
        self.chosen_for: str | None = None  # tree=auto: the model, device and engine it was chosen for
        self.set_tree(tree)

    def set_tree(self, tree: Tree, auto: dict | None = None) -> None:
        """Draft with ``tree`` from now on (``tree=auto`` sets the chosen one; ``auto`` says how it was chosen)."""
        device = self.device
        self.tree = tree.to(device)
        if auto is not None:
            self.auto = auto
        # Per depth: the slice of nodes it holds, their parents and ranks, for one gather each.
        depth = tree.depth.tolist()
        self.levels = []
        for d in range(1, tree.max_depth + 1):
            lo, hi = depth.index(d), len(depth) - depth[::-1].index(d)
            self.levels.append((lo, hi, self.tree.parent_index[lo:hi], self.tree.rank[lo:hi]))
        n = tree.size
        idx = torch.arange(n, device=device)
        self._later = idx[None, :] > idx[:, None]  # [n, n]: j comes after i in BFS order
        self._idx = idx
        self._buf = torch.zeros(n, dtype=torch.long, device=device)
        # How often each template node was on the accepted path (node 0: every step); calibrates trees.
        self.node_accepts = torch.zeros(n, dtype=torch.long)

    @classmethod
    def check(cls, params: Params) -> None:
        if params.tree != AUTO:
            load_template(params.tree)  # a tree file's mistakes, before the target loads

    @classmethod
    def build(cls, params: Params, *, vocab_size: int, device: torch.device) -> "TokenRecycling":
        k, tree_name, start, first_step = params.k, params.tree, params.start, params.first_step
        if k > vocab_size:
            raise HarnessError(f"method.k must be an integer from 1 to {min(vocab_size, 1024)}, got {k!r}")
        if tree_name == AUTO:  # a plain step until prepare() sets the chosen tree
            return cls(vocab_size, k, Tree.from_parents((-1,)), AUTO, start, device, first_step, params.reference)
        tree = load_template(tree_name)
        if params.fit_tree_to_k:
            tree = fit_tree(tree, k)
        need = int(tree.rank.max()) + 1
        if need > k:
            raise TreeError(f"tree '{tree_name}' uses ranks up to {need - 1}, which needs method.k >= {need} "
                            f"(got {k}); raise method.k, or set method.fit_tree_to_k=true to clip the tree")
        if tree.size < 2:
            raise TreeError(f"tree '{tree_name}' has no draft nodes; TR needs at least one")
        return cls(vocab_size, k, tree, tree_name, start, device, first_step, params.reference)

    def prepare(self, preparation: Preparation) -> None:
        """tree=auto: choose the tree for this engine and device (``methods.calibrate``)."""
        if self.tree_name == AUTO and self.auto is None:
            self.set_tree(*auto_tree(self, preparation))
            self.chosen_for = preparation.describe()

    def artefacts(self) -> dict[str, object]:
        """tree=auto: the chosen tree as ``tree.json``, reusable as ``method.tree=RUN/tree.json``."""
        if self.auto is None:
            return {}
        auto = self.auto
        return {"tree.json": {
            "name": "auto", "parents": list(self.tree.parents),
            "description": f"chosen by method.tree=auto for {self.chosen_for or 'this run'}: "
                           f"{auto['drafts']} drafts, MAT {auto['mat']:.2f} ({auto['mat_source']}), expected "
                           f"speedup {auto['expected_speedup']:.2f}x"}}

    def sibling(self, tree: str) -> "TokenRecycling":
        """A new TR with this one's K and start policy and another tree, clipped to K (calibration)."""
        return self.build(self.Params(k=self.k, tree=tree, start=self.start, fit_tree_to_k=True),
                          vocab_size=self.M.shape[0], device=self.device)

    def reset(self, prompt_ids: torch.Tensor, turn: int, prompt_logits: torch.Tensor | None,
              prompt_hidden: torch.Tensor | None = None) -> None:
        if self.start in ("cold", "prompt") and turn == 0:
            self.M.zero_()
        if prompt_logits is not None:
            self._write(prompt_ids, prompt_logits.topk(self.k, dim=-1).indices)

    def fork(self) -> "TokenRecycling":
        """A hot start shares the matrix with the batch (every slot's verified nodes written into it, slot after slot
        at each step: ``decode_batch``); a cold or prompt start clears it per question, so each slot has its own."""
        other = super().fork()
        if self.start in ("cold", "prompt"):
            other.M = self.M.clone()
        other._buf = self._buf.clone()
        return other

    def propose(self, context: torch.Tensor) -> Draft:
        tokens = self._buf
        tokens[0] = context[-1]
        for lo, hi, parent, rank in self.levels:
            tokens[lo:hi] = self.M[tokens[parent], rank]
        return Draft(tokens.clone(), self.tree, keys=self.tree.ranks)

    def update(self, draft: Draft, result: Verification) -> None:
        """Every verified node's row, whoever drafted the tree (a hybrid's other drafter too), unless the
        reference does not learn from this forward; the template's acceptance statistics from TR's own trees
        only, and within the answer."""
        if result.learn:
            self._write(draft.tokens, result.topk)
        if draft.tree is self.tree and not result.past_answer:
            self.node_accepts[result.path] += 1

    def skipped(self, draft: Draft, result: Verification) -> None:
        """A plain step a per-step budget took without a draft: the root's row, from its logits."""
        self.update(draft, result)

    def _write(self, tokens: torch.Tensor, top: torch.Tensor) -> None:
        """``M[tokens[i]] = top[i]`` (the top-K successors at position i) for all i; duplicates: the last i wins.

        Every occurrence of a token is given the row of its last occurrence, so the
        scatter writes identical rows for duplicates and its order does not matter
        (index_put_ leaves the order of duplicate writes unspecified).
        """
        top = top.to(self.M.dtype)  # [n, K]
        if len(tokens) == 1:  # a plain step's root alone: nothing to deduplicate
            self.M[tokens] = top
            return
        if len(tokens) == self.tree.size:
            later, idx = self._later, self._idx
        else:
            idx = torch.arange(len(tokens), device=tokens.device)
            later = idx[None, :] > idx[:, None]
        same = tokens[:, None] == tokens[None, :]
        last = torch.where(same & later, idx[None, :], idx[:, None]).amax(dim=1)
        self.M[tokens] = top[last]

    def step_sizes(self) -> list[int]:
        return [self.tree.size]  # tree=auto: called after the tree is chosen

    def state_dict(self) -> dict:
        return {"M": self.M, "node_accepts": self.node_accepts, "tree_parents": list(self.tree.parents),
                "auto": self.auto}

    def load_state_dict(self, state: dict) -> None:
        """A resumed run continues with the saved matrix and the saved tree (tree=auto: the one chosen then)."""
        parents = tuple(state.get("tree_parents", self.tree.parents))
        if parents != self.tree.parents:
            if self.tree_name != AUTO:
                raise ValueError(f"the saved TR state drafts with another tree than '{self.tree_name}'")
            self.set_tree(Tree.from_parents(parents), state.get("auto"))
        self.M.copy_(state["M"])
        self.node_accepts.copy_(state["node_accepts"])

    def summary(self) -> dict:
        return {
            "k": self.k, "tree": self.tree_name, "tree_nodes": self.tree.size, "tree_depth": self.tree.max_depth,
            "start": self.start, "first_step": self.first_step, "reference": self.reference,
            "adjacency_shape": list(self.M.shape), "adjacency_dtype": str(self.M.dtype),
            "adjacency_bytes": self.M.numel() * self.M.element_size(),
            "adjacency_rows_filled": int((self.M != 0).any(dim=1).sum()),
            "tree_parents": list(self.tree.parents),
            "node_accepts": self.node_accepts.tolist(),
            **({"auto": self.auto} if self.auto else {}),
        }
