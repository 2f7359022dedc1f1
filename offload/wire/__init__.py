"""What travels between a worker and its consumers: framing, KV events, stats frames, publisher."""
