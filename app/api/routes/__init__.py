"""One router per resource; every router but the probes' requires the token."""
