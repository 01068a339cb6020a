"""Coupling measures from the stored statistics (torch-free): the m_K formulas, the measure
registry, the spectrum-matched null, the per-model metrics and the refusal of non-finite
values.
"""
