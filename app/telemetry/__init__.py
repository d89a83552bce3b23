"""Telemetry shared by every service: metrics that stay correct across the worker
processes of one server, structured logs and request ids."""
