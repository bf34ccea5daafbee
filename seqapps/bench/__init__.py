"""Micro-benchmarks of seqapps components."""
