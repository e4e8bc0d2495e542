"""Decoding methods: one shared engine (tree, verifier, loop, KV cache) and one small proposer per method.

``methods/`` is a stack: what every part uses at the top of the package (``common``, ``params``, ``tree``,
``sampling``, ``base``, ``verify``, ``decode``, ...), the engines in ``engine/``, the draft heads in ``heads/``, one
module per method in ``proposers/`` (the registry, ``methods.base.registry``, finds them there). ``python -m
methods`` lists every method's and engine's parameters. Nothing here imports ``evaluation/`` or ``scripts/``.
"""
