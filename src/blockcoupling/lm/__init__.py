"""Language models: sources, loading and random-init twins, the hub cache, prompt sets, the
Shakespeare corpus, training from scratch and evaluation.
"""
