"""Decoding methods: one shared engine (tree, verifier, loop, KV cache) and one small proposer per method."""
from methods import vanilla  # noqa: F401  (registers itself)
from methods.base import Draft, Proposer, Verification, build_proposer, known_methods  # noqa: F401
