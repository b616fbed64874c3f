"""Rendering of a Snapshot into Prometheus metric families, one module per domain."""
