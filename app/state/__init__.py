"""What the sidecar knows: the block index, the event log and each publisher's state."""
