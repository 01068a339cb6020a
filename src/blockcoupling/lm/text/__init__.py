"""Text the models read: Shakespeare's plays (``corpus``) and the prompt sets (``prompts``)."""
