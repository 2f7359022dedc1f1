"""Receiving publishers' frames: kvscope workers and vLLM's own KV-event publisher.

The sidecar meets a publisher one of two ways, and one sidecar may do both.
Connect mode: a SUB socket per publisher, connected to the PUB socket the
publisher binds, so the socket says who sent a frame. Listen mode: one SUB
socket bound to the ``listen`` endpoints, which any number of publishers
connect to; a frame goes to the publisher of its stream (topic and rank,
app/streams.py), added on its first frame.

``ingestor`` is the thread that owns every socket and applies what arrives;
``replay`` is one gap being filled from a publisher's replay socket beside
the rest of the traffic; ``sockets`` makes every socket they receive on.
"""

from app.ingest.ingestor import MAX_SEQ_JUMP, POLL_MS, Ingestor, ListenError

__all__ = ["MAX_SEQ_JUMP", "POLL_MS", "Ingestor", "ListenError"]
