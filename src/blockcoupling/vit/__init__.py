"""The ViT stochastic-depth x weight-decay sweep: the model, its run config and grid, the image
sets, training, and the sweep's one dataset.
"""
