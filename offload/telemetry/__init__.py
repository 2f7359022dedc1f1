"""Telemetry of the core: counters, histograms, spans and metric definitions."""
