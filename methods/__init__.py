"""Decoding methods: one shared engine (tree, verifier, loop, KV cache) and one small proposer per method."""
# each method's module registers it
from methods import eagle, eagle3, hydra, lookahead, medusa, pld, rest, sam, sps, tr, vanilla  # noqa: F401
from methods.base import Draft, Proposer, Verification, build_proposer, known_methods  # noqa: F401
