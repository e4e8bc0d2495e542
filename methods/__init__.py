"""Decoding methods: one shared engine (tree, verifier, loop, KV cache) and one small proposer per method."""
from methods import eagle, lookahead, medusa, pld, rest, sam, sps, tr, vanilla  # noqa: F401  (each registers itself)
from methods.base import Draft, Proposer, Verification, build_proposer, known_methods  # noqa: F401
