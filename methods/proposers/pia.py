"""PIA, Ant Group's "Lookahead" (Zhao et al., arXiv 2312.12728, KDD 2024): multi-branch drafts from a trie of the
n-grams that followed each token in the prompt and the answer so far, verified as a tree.

For every token t the trie keeps the branches of up to ``branch_length + 1`` tokens that followed t, each node with
how often it was seen in the prompt (input) and in answers (output). A step looks up the trie of the token before
the root with the root as its first token (a match of two), else (fewer than ``branch_length`` tokens found) the trie
of the root itself, and drafts its branches depth first, children by frequency (outputs weigh 1e-4 of an input),
up to ``decoding_length`` tokens with the root, at most ``branch_length`` deep; where the matched branches hold more
than that, the ``decoding_length / 2`` most frequent output nodes and then the most frequent others are kept. A
node whose children were all left out of a full draft ends no branch: it is forwarded, never accepted. The prompt
(all but its last token, which roots the first step) joins the trie at the request's first draft, each answer's
tokens as they are committed, an n-gram once the ``branch_length`` tokens after it exist (the rest when the answer
ends). ``memory=run`` keeps the answers' n-grams from request to request (a request's prompt's frequencies leave
when it ends, the other requests' staying: the server's cache of PIA, with its decay of old branches),
``memory=request`` (default) a trie per request.

This follows SpecTTS-Bench's PIA (sunshy-1/SpecTTS-Bench at 6b33e4a: ``code/model/pia/lookahead_cache.py``, Ant
Group's ``LookaheadCache``, and ``code/evaluation/inference_pia.py``'s ``pia_forward``) with its defaults
(``--branch-length 12``, ``--decoding-length 64``; ``hier_get`` in ``mix`` mode, ``min_output_size`` half the
decoding length). ``reference=true`` is that loop step for step, where it differs from the default: a step
without a draft adds its new token to the answer's n-grams and a drafted step its root and accepted tokens, so a
root that followed a plain step is added twice; the answer's last n-grams are never added and its last tokens stay
in the buffer, to begin the next request's; the prompt's n-grams stay; and the trie goes on from request to
request unless a request's first 10 prompt tokens differ from the request's before (or that one was a
SpecTTS-Bench warm-up: "WARMUPFLAG" at its place in a Qwen3 or DeepSeek-R1 prompt). With a fixed system prompt
(the embedded models' chat template) the first 10 tokens never differ, so the trie holds every answer of the run,
the warm-up's included.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from methods.base import Draft, Ending, Preparation, Proposer, register
from methods.params import param
from methods.tree import Tree

OUTPUT_WEIGHT = 1e-4  # an output's frequency against an input's, in the draft's order (LookaheadCache's default)
MAX_NODES, MAX_OUTPUT_NODES = 65536, 512  # a trie is halved (squeeze) past these, once 1024 tries have grown
SQUEEZE_AFTER = 1024
PREFIX = 10  # reference=true: a request whose first PREFIX prompt tokens are the last request's keeps the trie
# reference=true: the token ids of SpecTTS-Bench's warm-up prefix ("WARMUPFLAG") in its two models' prompts, and
# where they stand (code/evaluation/inference_pia.py lines 17-19)
WARMUP_MARKS = {"deepseek": (2, [54, 18394, 3202]), "qwen3": (3, [54, 17911, 3124, 22542])}
# reference=true: the loop ends as pia_forward's does (lines 216-236): the bonus stays pending as the next root, the
# loop breaks before its trie update once a step's root and accepted tokens hold EOS, or bring its count (the tokens
# after the prompt, the pending bonus left out) past max_new_tokens, or its bonus is EOS; and it makes at most
# max_new_tokens forwards (for i in range(max_new_tokens)), the last learned from
REFERENCE_ENDING = Ending(past=2, learns_last=False, stops_on_bonus=True, learns_on_bonus=False, max_forwards=True)


class _Node:
    """A branch token: its children by token (in the order they were first seen) and how often it was seen after
    its parent in prompts (``fin``) and in answers (``fout``)."""

    __slots__ = ("kids", "fin", "fout")

    def __init__(self):
        self.kids: dict[int, _Node] = {}
        self.fin = self.fout = 0.0

    def weight(self) -> float:
        return (1.0 - OUTPUT_WEIGHT) * self.fin + OUTPUT_WEIGHT * self.fout


def _depth_first(kids: dict, keep=None):
    """(token, node) of every node below ``kids``, depth first, children in the order they came; a node that ``keep``
    refuses is left out with all below it."""
    stack = [iter(kids.items())]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
        elif keep is None or keep(item[1]):
            yield item
            stack.append(iter(item[1].kids.items()))


class _Branches:
    """The branches that followed one token."""

    __slots__ = ("kids", "nodes", "output_nodes")

    def __init__(self):
        self.kids: dict[int, _Node] = {}
        self.nodes = self.output_nodes = 0  # ever made, for the squeeze

    def add(self, tokens: list[int], output: bool) -> None:
        kids = self.kids
        for i, t in enumerate(tokens):
            node = kids.get(t)
            if node is None:  # the rest is new: a chain
                for u in tokens[i:]:
                    node = kids[u] = _Node()
                    node.fin, node.fout = (0.0, 1.0) if output else (1.0, 0.0)
                    kids = node.kids
                self.nodes += len(tokens) - i
                self.output_nodes += (len(tokens) - i) if output else 0
                return
            if output:
                node.fout += 1.0
            else:
                node.fin += 1.0
            kids = node.kids

    def remove_input(self, tokens: list[int]) -> None:
        """``add(tokens, False)`` undone, as far as its nodes are left (a squeeze may have dropped some)."""
        kids = self.kids
        for t in tokens:
            node = kids.get(t)
            if node is None:
                return
            node.fin -= 1.0
            kids = node.kids

    def squeeze(self) -> None:
        """Past its bounds, halve every output frequency and drop the nodes seen at most once in answers."""
        if self.nodes <= MAX_NODES and self.output_nodes <= MAX_OUTPUT_NODES:
            return

        def halve(kids: dict) -> None:
            for t, node in list(kids.items()):
                if node.fout > 1.0:
                    node.fout *= 0.5
                    halve(node.kids)
                else:
                    del kids[t]

        halve(self.kids)
        count, stack = 0, [self.kids]
        while stack:
            kids = stack.pop()
            count += len(kids)
            stack.extend(n.kids for n in kids.values())
        self.nodes = self.output_nodes = count

    def draft(self, after: list[int], size: int, depth: int, keep_outputs: int):
        """Branches that continue ``after`` (a prefix of them), depth first: (tokens, parents, on_a_branch) with the
        root first, or None where nothing continues it."""
        kids = self.kids
        for t in after:
            node = kids.get(t)
            kids = node.kids if node is not None and (node.fin > 0 or node.fout > 0) else {}
            if node is None:
                break
        if not kids:
            return None
        # (token, fin, fout, weight) of every node below, depth first (one never seen, its inputs forgotten: left out)
        seen = [(t, node.fin, node.fout, node.weight())
                for t, node in _depth_first(kids, lambda node: node.fout > 0 or node.fin > 0)]
        floor_out = floor_mix = 1e9  # more nodes than fit: the outputs and weights a kept node must reach
        if len(seen) > size:
            by_out = sorted(seen, key=lambda x: x[2], reverse=True)
            floor_out = by_out[keep_outputs - 1][2]
            tokens = {x[0] for x in by_out[:keep_outputs]}  # (tokens, not nodes: as the reference counts them)
            if len(tokens) < size:
                by_weight = sorted(seen, key=lambda x: x[3], reverse=True)
                rest = size - len(tokens)
                tokens.update(x[0] for x in by_weight[:rest])
                have = len(tokens)
                for x in by_weight[rest: min(rest + size, len(seen))]:
                    if x[0] in tokens:
                        continue
                    have += 1
                    if have >= size:
                        floor_mix = x[3]
                        break
        else:
            floor_mix = 0.0
        out_tokens, parents, ends = [-1], [-1], set()

        def walk(kids: dict, parent: int, room: int, path: list[int]) -> None:
            if len(out_tokens) >= size or room <= 0:
                ends.update(path)
                return
            for t, node in sorted(kids.items(), key=lambda kv: kv[1].weight(), reverse=True):
                if len(out_tokens) >= size:
                    return
                if node.fout < floor_out and node.weight() < floor_mix:  # (and its input under 1e9: always)
                    continue
                out_tokens.append(t)
                parents.append(parent)
                here = path + [len(out_tokens) - 1]
                if node.kids:
                    walk(node.kids, len(out_tokens) - 1, room - 1, here)
                else:
                    ends.update(here)

        walk(kids, 0, depth, [0])
        return out_tokens, parents, [i in ends for i in range(len(out_tokens))]


class NgramTrie:
    """Every token's branches (SpecTTS-Bench's ``LookaheadCache`` with one slot of output, ``idx`` 0)."""

    def __init__(self, branch: int, stops: set[int], cut_prompts: bool = False):
        self.branch, self.stops = branch, stops  # branch: tokens stored after each token
        self.cut_prompts = cut_prompts  # a prompt's n-grams end at its first stop token (the reference's: ChatML's
        #                                 first <|im_end|> ends the system message, so its question is never added)
        self.clear()

    def clear(self) -> None:
        self.trees: dict[int, _Branches] = {}
        self.grown: set[int] = set()  # tries grown since the last squeeze (by their token)

    def _cut(self, tokens: list[int]) -> list[int]:
        """Up to the first stop token (the reference's eos), left out."""
        for i, t in enumerate(tokens):
            if t in self.stops:
                return tokens[:i]
        return tokens

    def _add(self, token: int, after: list[int], output: bool) -> None:
        tree = self.trees.get(token)
        if tree is None:
            tree = self.trees[token] = _Branches()
            if output:
                self.grown.add(token)
        else:
            self.grown.add(token)
        tree.add(after, output)

    def state(self) -> dict:
        """The trie as tensors (every token's branches depth first, children in the order they came, which breaks the
        draft's ties), for a run's saved state."""
        ints, floats = [], []
        for token, tree in self.trees.items():
            ints += [token, len(tree.kids), tree.nodes, tree.output_nodes]
            for t, node in _depth_first(tree.kids):
                ints += [t, len(node.kids)]
                floats += [node.fin, node.fout]
        return {"trie": torch.tensor(ints, dtype=torch.int64), "freqs": torch.tensor(floats, dtype=torch.float64),
                "grown": torch.tensor(sorted(self.grown), dtype=torch.int64)}

    def load(self, state: dict) -> None:
        self.clear()
        ints, floats = iter(state["trie"].tolist()), iter(state["freqs"].tolist())

        def fill(kids: dict, n: int) -> None:
            for _ in range(n):
                t, m = next(ints), next(ints)
                node = kids[t] = _Node()
                node.fin, node.fout = next(floats), next(floats)
                fill(node.kids, m)

        for token in ints:
            tree = self.trees[token] = _Branches()
            n, tree.nodes, tree.output_nodes = next(ints), next(ints), next(ints)
            fill(tree.kids, n)
        self.grown = set(state["grown"].tolist())

    def _prompt_branches(self, tokens: list[int]):
        """(token, the branch after it) of every token of a prompt but its last."""
        tokens = self._cut(tokens) if self.cut_prompts else tokens
        return ((tokens[i], tokens[i + 1: i + 1 + self.branch]) for i in range(len(tokens) - 1))

    def add_prompt(self, tokens: list[int]) -> None:
        for token, after in self._prompt_branches(tokens):
            self._add(token, after, False)

    def remove_prompt(self, tokens: list[int]) -> None:
        """``add_prompt(tokens)`` undone: its input frequencies, not the nodes (the server cache's reset of one
        request's inputs; the other requests' prompts stay)."""
        for token, after in self._prompt_branches(tokens):
            if token in self.trees:
                self.trees[token].remove_input(after)

    def add_output(self, buffer: list[int], tokens: list[int], final: bool) -> list[int]:
        """Answer tokens into ``buffer`` (a slot's tokens whose n-grams are not all in yet), the n-grams that now have
        all their tokens added; ``final``: the rest too, and the tries past their bounds squeezed. The buffer left."""
        buffer = buffer + self._cut(tokens)
        least = 1 if final else self.branch
        if len(buffer) > least:
            for i in range(len(buffer) - least):
                self._add(buffer[i], buffer[i + 1: i + 1 + self.branch], True)
            buffer = buffer[len(buffer) - self.branch:] if not final else buffer
        if final:
            buffer = []
            if len(self.grown) >= SQUEEZE_AFTER:
                for t in self.grown:
                    self.trees[t].squeeze()
                self.grown.clear()
        return buffer

    def draft(self, before: int, root: int, size: int, depth: int):
        """The reference's ``hier_get``: the branches of ``before`` that go on with ``root``, or (fewer than
        ``depth`` tokens) those of ``root``; None for neither."""
        found = None
        for token, after in ((before, [root]), (root, [])):
            tree = self.trees.get(token)
            if tree is None:
                continue
            found = tree.draft(after, size, depth, max(size // 2, 1))
            if found is not None and len(found[0]) >= depth:
                break
        return found


@register
class Pia(Proposer):
    name = "pia"
    token_only = True
    drafts_first = True  # the reference prefills the prompt but its last token, which roots the first step
    resumes_mid_request = True  # its saved state is the trie and the slot's buffer as they were

    @dataclass
    class Params:  # SpecTTS-Bench's (code/evaluation/inference_pia.py)
        decoding_length: int = param(64, "most tokens a draft tree holds, the root included", low=2, high=1024)
        branch_length: int = param(12, "deepest branch (tokens after the root); the trie keeps the branch_length + 1 "
                                   "tokens after every token", low=1, high=256)
        memory: str = param("request", "request: a trie per request (its prompt and answer so far); run: answers' "
                            "n-grams stay from request to request (the warm-up's left out)",
                            choices=("request", "run"))
        reference: bool = param(False, "true: SpecTTS-Bench's loop step for step (module docstring): its feeding of "
                                "the trie, no flush of an answer's last n-grams, the prompt's kept, and the trie kept "
                                "unless a request's first 10 prompt tokens change")

    def __init__(self, params: Params, device: torch.device):
        self.size, self.depth, self.reference = params.decoding_length, params.branch_length, params.reference
        self.keeps = params.memory == "run" or params.reference
        self.memory = "run" if self.keeps else "none"
        self.trie = NgramTrie(params.branch_length + 1, set(), cut_prompts=params.reference)
        self.shared = {"last_prompt": None, "family": "qwen3"}  # reference=true: the reset rule's memory
        self.ending = REFERENCE_ENDING if params.reference else None
        self.owner = True  # the batch's first slot
        self.buffer: list[int] = []  # this slot's answer tokens whose n-grams are not all in the trie
        self.fed = self.prompt_len = 0  # the context's tokens in the trie (or the buffer); the request's prompt's
        self.prompt: list[int] = []  # the request's prompt (but its last token), in the trie from its first draft on
        self.pending = False  # reset, its prompt not yet in the trie (a resumed slot's state says whether it is)
        self.device = device

    @classmethod
    def build(cls, params: Params, *, vocab_size: int, device: torch.device) -> "Pia":
        return cls(params, device)

    def prepare(self, preparation: Preparation) -> None:
        self.trie.stops = set(preparation.stop_ids)
        self.shared["family"] = "deepseek" if "deepseek" in preparation.model_name.lower() else "qwen3"

    def fork(self) -> "Pia":
        other = super().fork()
        if not self.keeps:
            other.trie = NgramTrie(self.trie.branch, self.trie.stops, self.trie.cut_prompts)
        other.buffer = []
        other.owner = False  # a shared trie is saved with the first slot's state
        return other

    def reset(self, prompt_ids, turn, prompt_logits, prompt_hidden=None) -> None:
        prompt = prompt_ids.tolist()  # the prompt but its last token (drafts_first)
        if self.reference:
            last = self.shared["last_prompt"]
            offset, marks = WARMUP_MARKS[self.shared["family"]]
            if last is None or last[:PREFIX] != prompt[:PREFIX] or last[offset: offset + len(marks)] == marks:
                self.trie.clear()
                self.buffer = []
            self.shared["last_prompt"] = prompt[:PREFIX]
        elif not self.keeps:
            self.trie.clear()
            self.buffer = []
        self.prompt, self.pending = prompt, True  # it joins at the first draft: a resumed slot's state says if it did
        self.fed = len(prompt)  # the tokens of the context whose n-grams are in (or in the buffer)
        self.prompt_len = len(prompt) + 1  # the whole prompt: its last token roots the first step

    def propose(self, context: torch.Tensor) -> Draft:
        if self.pending:
            self.trie.add_prompt(self.prompt)
            self.pending = False
        if not self.reference:  # the committed tokens, the root included, join the answer's n-grams
            self.buffer = self.trie.add_output(self.buffer, context[self.fed:].tolist(), final=False)
            self.fed = len(context)
        root = context[-1:]
        found = self.trie.draft(int(context[-2]) if len(context) > 1 else -1, int(root), self.size, self.depth)
        if found is None or len(found[0]) == 1:
            return Draft(root, Tree.chain(1).to(root.device))
        tokens, parents, ends = found
        tree, order = Tree.breadth_first(parents)
        tokens[0] = int(root)
        acceptable = torch.tensor([ends[i] for i in order], device=root.device)
        return Draft(torch.tensor([tokens[i] for i in order], device=root.device), tree.to(root.device),
                     acceptable=None if bool(acceptable.all()) else acceptable)

    def update(self, draft: Draft, result) -> None:
        """reference=true: the trie learns as pia_forward's loop feeds it (module docstring); ours catches up on
        the committed tokens in ``propose`` and ``finish``."""
        if not self.reference or not result.learn:  # the step that ends the reference's loop breaks before it
            return
        if draft.tree.size == 1:
            fed = result.new_tokens[-1:]  # the step's new token, which roots the next step (fed again there)
        else:
            fed = [int(draft.tokens[0])] + result.new_tokens[:-1]  # the root and the accepted drafts
        self.buffer = self.trie.add_output(self.buffer, fed, final=False)

    def skipped(self, draft: Draft, result) -> None:
        self.update(draft, result)

    def finish(self, answer: list[int]) -> None:
        """Where the trie outlives the request (the reference adds neither): its prompt's frequencies leave (the other
        slots' stay), and the answer's tokens not yet in (its last step's) and its last n-grams join."""
        if not self.reference and self.keeps:
            if not self.pending:
                self.trie.remove_prompt(self.prompt)
            done = self.fed - self.prompt_len  # answer tokens already in: the context past the whole prompt
            self.buffer = self.trie.add_output(self.buffer, answer[max(done, 0):], final=True)
        self.pending = False

    def after_warmup(self) -> None:
        if not self.reference:
            self.trie.clear()
            self.buffer = []

    def step_sizes(self) -> list[int]:
        return list(range(1, self.size + 1))

    def state_dict(self) -> dict:
        """The trie (a shared one with the first slot's), this slot's buffer and place in its request, and the
        prompt the reference's reset rule compares with."""
        last = self.shared["last_prompt"]
        trie = self.trie.state() if self.owner or not self.keeps else {}
        return {**{f"pia_{k}": v for k, v in trie.items()},
                "pia_buffer": torch.tensor(self.buffer, dtype=torch.int64),
                "pia_prompt": torch.tensor(self.prompt, dtype=torch.int64), "pia_pending": self.pending,
                "pia_fed": self.fed, "pia_prompt_len": self.prompt_len,
                "pia_last_prompt": torch.tensor(last if last is not None else [-1], dtype=torch.int64)}

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        if "pia_trie" in state:
            self.trie.load({k.removeprefix("pia_"): state[k] for k in ("pia_trie", "pia_freqs", "pia_grown")})
        self.buffer, self.prompt = state["pia_buffer"].tolist(), state["pia_prompt"].tolist()
        self.pending = bool(state["pia_pending"])
        self.fed, self.prompt_len = int(state["pia_fed"]), int(state["pia_prompt_len"])
        last = state["pia_last_prompt"].tolist()
        self.shared["last_prompt"] = None if last == [-1] else last

    def summary(self) -> dict:
        return {"decoding_length": self.size, "branch_length": self.depth, "reference": self.reference,
                "memory": self.memory, "tries": len(self.trie.trees)}
