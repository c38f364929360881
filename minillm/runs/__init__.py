"""Workloads in, traces and metrics out: the seed story and the crowds, one call to serve them, what they measure."""
