"""The CPU tier: its manager, block pool, sizing, manager stats and eviction policies."""
