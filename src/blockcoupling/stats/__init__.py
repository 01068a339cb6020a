"""Statistics on combined coupling datasets, one module per analysis family.

`core` holds the shared primitives (selection, bootstrap, correlation with CIs, cluster-robust
inference, Holm, table writing); `crossmodel`, `checkpoints` and `vit` the analyses of each family.
Inputs follow docs/datasets.md; results are tidy pandas DataFrames (CSV) or xarray Datasets.
"""
