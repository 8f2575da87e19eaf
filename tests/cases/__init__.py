"""Code the worker ranks run (see ``../_pool.py``), plus the input generator and the oracle.

Every rank regenerates every rank's inputs from the same seed, so the oracle computes the
expected outputs of its own rank with no communication at all.
"""
