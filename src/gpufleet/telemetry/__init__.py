"""Telemetry: the metric schema, device collectors, storage queries and the diagnosis rules."""
