"""The files the workflow writes: atomic NetCDF with provenance, CF labels, combining per-model
files, and the results' content hashes.
"""
