"""Evaluation suites (JSON results and plots)."""
