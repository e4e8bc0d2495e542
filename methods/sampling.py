"""Sampling at temperature > 0 that every method reproduces token for token.

Settings (``sampling.*`` in a run's config): ``temperature`` (0: greedy, the default), ``top_k`` (0: off),
``top_p`` (1: off) and ``seed``. The target's distribution at a position is the softmax of its logits
processed as transformers' sampling warpers process them, in ``generate``'s order: divided by the
temperature, then all but the ``top_k`` largest logits removed (ties with the k-th kept), then all but
the smallest set of most likely tokens whose probability reaches ``top_p``: a token is removed when the tokens
more likely than it hold ``top_p`` (so the most likely always stays, and tokens of equal probability at the
edge stay or go together, where transformers keeps those its sort happens to put first).

**Position-keyed draws.** The j-th new token of a turn is the Gumbel-max draw: the token of the largest
processed logit plus a Gumbel noise ``g_j[v] = -log(-log(u_j[v]))``, where ``u_j`` is one uniform number per
vocabulary entry from a generator seeded by a hash of (seed, question, turn, j) (``Sampler.noise``), so it
depends on nothing a method changes; the argmax of logits plus Gumbel noise is a draw from their softmax
(the Gumbel-max trick; e.g. Maddison, Tarlow and Minka, "A* Sampling", NeurIPS 2014). A speculative
method verifies a draft node at depth d below a root whose next token is the j-th by comparing the
node's token with its parent's draw for position j + d - 1 (``Sampler.draw`` at every node, then the
greedy acceptance rule with the draws in place of the argmax: ``methods.verify``). Every committed token is then the draw vanilla sampling makes at its
position from the target's distribution given the same prefix, so **every method's tokens equal vanilla
sampling's with the same seed** (in fp32, up to a near-tie: two perturbed logits within float noise of
each other, about as rare as a greedy near-tie; ``evaluation.equal`` says where). The output has exactly
the target's distribution, and a draft x is accepted with probability p(x), a set of siblings with the sum
of theirs: what the rule of EAGLE-2 and SAM-Decoding for deterministic drafts (accept with p(x), on
rejection zero it and renormalise) achieves, with reproducibility on top.

Why not inverse CDF on one uniform per position: a method's logits differ from vanilla's in their last
bits (another batch shape, another summation order), which moves every boundary of the cumulative
distribution by about 1e-6; at temperature 1 the draw lands that close to a boundary, or inside the
long tail of tokens narrower than that, often enough that about a third of 128-token turns diverged by
such a near-tie (results/MEASUREMENTS.md, "Sampling"). Gumbel-max turns a tie into two perturbed logits
within 1e-5 of each other, which a continuous noise makes rare.

>>> s = Sampler(Sampling(temperature=1.0, seed=1), question=81, turn=0)
>>> s.draw(torch.tensor([[0.0, 0.0, 9.0]]), torch.tensor([0]), 0, 0).tolist()  # nearly all mass on token 2
[2]
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from methods.common import HarnessError

MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0: greedy decoding
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1: no top-p filter
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not 0 <= self.temperature <= 100:
            raise HarnessError(f"sampling.temperature must be a number from 0 (greedy) to 100, got "
                               f"{self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise HarnessError(f"sampling.top_k must be an integer of at least 0 (0: off), got {self.top_k!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise HarnessError(f"sampling.top_p must be a number above 0 and at most 1 (1: off), got {self.top_p!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise HarnessError(f"sampling.seed must be an integer of at least 0, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def label(self) -> str:
        """How tables name these settings: ``greedy``, or ``T=0.7`` with its filters and seed."""
        if self.greedy:
            return "greedy"
        parts = [f"T={self.temperature:g}"] + ([f"top_k={self.top_k}"] if self.top_k else []) \
            + ([f"top_p={self.top_p:g}"] if self.top_p < 1 else [])
        return " ".join(parts + [f"seed={self.seed}"])


def processed_logits(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Logits [n, vocab] (float32) of ``logits`` [n, vocab] under ``s`` (temperature > 0): divided by the temperature,
    the tokens that top-k and top-p remove at -inf."""
    x = logits.float() / s.temperature
    if s.top_k and s.top_k < x.shape[-1]:
        kth = x.topk(s.top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if s.top_p < 1:
        probs = x.softmax(dim=-1)
        ranked = probs.sort(dim=-1, descending=True).values
        mass = ranked.double().cumsum(dim=-1)  # of the i + 1 most likely tokens
        more_likely = torch.searchsorted(-ranked, -probs)  # how many tokens are more likely than each
        before = torch.where(more_likely > 0, mass.gather(-1, (more_likely - 1).clamp_min(0)), 0.0)
        x = x.masked_fill(before >= s.top_p, float("-inf"))
    return x


def process(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Probabilities [n, vocab] (float32) of ``logits`` [n, vocab] under ``s`` (temperature > 0)."""
    return processed_logits(logits, s).softmax(dim=-1)


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def key(*values: int) -> int:
    """A 63-bit seed fixed by ``values`` (a splitmix64 hash chain).

    >>> key(0, 81, 0, 5) == key(0, 81, 0, 5) != key(0, 81, 0, 6)
    True
    """
    x = 0
    for v in values:
        x = _splitmix64(x ^ (v & MASK64))
    return x >> 1


def gumbel(u: torch.Tensor) -> torch.Tensor:
    """Gumbel noise -log(-log(u)) of uniform numbers ``u`` (u = 0 gives -inf: that token is never drawn)."""
    return -(-u.log()).log()


class Sampler:
    """The draws of one turn: ``draw(logits, depth, start, max_depth)`` gives the token at every row's position."""

    KEEP = 64  # positions whose noise is kept (a step asks for its own and the next few)

    def __init__(self, settings: Sampling, question: int, turn: int):
        self.settings, self.question, self.turn = settings, question, turn
        self._noise: dict[int, torch.Tensor] = {}

    def generator(self, position: int, salt: int, device: torch.device) -> torch.Generator:
        """A generator seeded by (seed, question, turn, position, salt): randomness a step needs beyond the draws'
        (a drafter sampling its drafts, salt 1; the rejection rule, salt 2), reproducible."""
        return torch.Generator(device=device).manual_seed(key(self.settings.seed, self.question, self.turn,
                                                              position, salt))

    def noise(self, position: int, vocab: int) -> torch.Tensor:
        """Gumbel noise [vocab] (float32, CPU) of new-token index ``position``: the same on every device."""
        g = self._noise.get(position)
        if g is None or g.shape[0] != vocab:
            u = torch.rand(vocab, generator=self.generator(position, 0, torch.device("cpu")))
            g = self._noise[position] = gumbel(u)
            if len(self._noise) > self.KEEP:
                del self._noise[min(self._noise)]
        return g

    def scores(self, logits: torch.Tensor, depth: torch.Tensor, start: int, max_depth: int) -> torch.Tensor:
        """Perturbed logits [n, vocab]: row i's processed logits plus the noise of new-token index
        ``start + depth[i]`` (``depth`` [n] on the logits' device, at most ``max_depth``; no host sync)."""
        return processed_logits(logits, self.settings) + self._noise_rows(depth, start, max_depth, logits)

    def _noise_rows(self, depth: torch.Tensor, start: int, max_depth: int, logits: torch.Tensor) -> torch.Tensor:
        """The noise [n, vocab] of every row's new-token index ``start + depth[i]``, on the logits' device."""
        noise = torch.stack([self.noise(p, logits.shape[-1]) for p in range(start, start + max_depth + 1)])
        return noise.to(logits.device, non_blocking=True)[depth]

    def draw(self, logits: torch.Tensor, depth: torch.Tensor, start: int, max_depth: int) -> torch.Tensor:
        """Tokens [n]: the Gumbel-max draw of every row of ``logits`` [n, vocab] at new-token index
        ``start + depth[i]``: the argmax of ``scores``.

        With top-p, ranking every row to find its nucleus (``processed_logits``) costs more than the forward for a
        tree of 80 rows over a 49k vocabulary; the draw needs only whether its own token is in the nucleus, i.e.
        whether the tokens more likely than it hold less than ``top_p``. So: take the argmax of the perturbed
        logits; where that token is outside the nucleus, so is every token as likely or less, which are removed
        before the next argmax (one or two rounds, a host sync each, where ``scores`` has none). The mass is
        summed in float64, as ``processed_logits`` sums it in rank order: the two can differ only where it is within
        about 1e-16 of ``top_p``."""
        s = self.settings
        if s.top_p == 1:
            return self.scores(logits, depth, start, max_depth).argmax(dim=-1)
        x = processed_logits(logits, replace(s, top_p=1.0))  # temperature and top-k
        y = x + self._noise_rows(depth, start, max_depth, logits)
        probs = x.softmax(dim=-1)
        while True:
            token = y.argmax(dim=-1, keepdim=True)
            p = probs.gather(-1, token)
            outside = torch.where(probs > p, probs, 0).sum(dim=-1, keepdim=True, dtype=torch.float64) >= s.top_p
            if not bool(outside.any()):
                return token[:, 0]
            y = y.masked_fill(outside & (probs <= p), float("-inf"))


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """What the target's distribution becomes after a draft of ``q`` is rejected: max(p - q, 0), renormalised."""
    r = (p - q).clamp_min_(0)
    total = float(r.sum())
    return r / total if total > 0 else p


def rejection(tokens: list[int], children: list[list[int]], logits: torch.Tensor, q: torch.Tensor, sampler: Sampler,
              position: int) -> tuple[list[int], int]:
    """(accepted path, bonus token) of a draft whose children were sampled without replacement from ``q`` [n, vocab]
    (row i: the drafter's distribution after node i), by recursive rejection sampling (SpecInfer's multi-draft
    speculative sampling, with the draft distribution renormalised without each rejected token, as sampling
    without replacement needs: Jeon et al., arXiv 2402.14160). At an accepted node with target distribution p,
    child x is accepted with probability min(1, p(x) / q(x)); on rejection p becomes max(p - q, 0) renormalised and
    q loses x; when every child is rejected, or at a leaf, the bonus token is drawn from what p has become. The
    tokens are the target's distribution exactly, but not vanilla's draws: reproducible per seed, not equal."""
    gen = sampler.generator(position, 2, logits.device)
    node, path = 0, [0]
    p = process(logits[:1], sampler.settings)[0]
    while children[node]:
        qn = q[node].float().clone()
        accepted = None
        for c in children[node]:
            x = tokens[c]
            if float(qn[x]) <= 0:  # not a sample of q (its support had fewer tokens than children): never taken
                continue
            r = float(torch.rand((), generator=gen, device=logits.device))
            if r * float(qn[x]) < float(p[x]):
                accepted = c
                break
            p = residual(p, qn)
            qn[x] = 0
            qn = qn / qn.sum() if float(qn.sum()) > 0 else qn
        if accepted is None:
            break
        node = accepted
        path.append(node)
        p = process(logits[node:node + 1], sampler.settings)[0]
    bonus = int(torch.multinomial(p, 1, generator=gen))
    return path, bonus
