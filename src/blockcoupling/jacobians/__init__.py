"""Block Jacobians and what is extracted from them (torch): capturing each block's real call, the
Jacobian engine, SVDs, the sufficient statistics, trajectories, and ``extract.measure``, the
one-call API.
"""
