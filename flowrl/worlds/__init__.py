"""Embedded worlds: synthetic generators, verifiers, models and pretraining recipes, one package each; each
provides a task of its own name through the task registry."""
