"""Hostile input over real sockets: what a peer sends never stalls, blows up or leaks."""
