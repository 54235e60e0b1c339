"""Measurement harness: timing, environment capture, result files, and the benchmark sweeps."""
