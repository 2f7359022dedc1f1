"""One router per resource; every router but the probes' requires the token (the event
stream's accepts it as ``?token=`` too). See docs/ARCHITECTURE.md, "The API".
"""
