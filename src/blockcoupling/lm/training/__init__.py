"""Training a small GPT-NeoX suite from scratch here: the run's configuration and checkpoint
schedule (``schedule``, torch-free), the data it reads (``data``), its checkpoints on disk
(``checkpoints``) and the training loop (``train``).
"""
