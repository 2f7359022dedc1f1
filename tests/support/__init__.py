"""Helpers the tests share: polling, live demo processes, raw ZMQ peers, thread interleaving,
KV caches for the transfer backends, random prefix-closed traces."""
