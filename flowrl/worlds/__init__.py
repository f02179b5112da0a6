"""Embedded worlds: synthetic generators, verifiers, models and pretraining recipes, one package each. A world is
not a task: each world provides a task of its own name through the task registry (what a config's `task.name`
selects), beside its renderer, verifier, models and recipes."""
