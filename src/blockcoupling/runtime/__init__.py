"""How jobs run: a rule script's runner, progress, the CPU instruction-set pin, deterministic
training and keyed work folders.
"""
