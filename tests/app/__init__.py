"""Tests of the sidecar and the command line, laid out like app/."""
