"""One module per decoding method: a ``Proposer`` registered by name (``methods.base.register``). The registry
imports every module here, so a new method's module needs no list to join."""
