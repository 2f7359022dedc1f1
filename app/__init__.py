"""kvscope's sidecar service and command line."""
