"""The shapes world: renderer, prompt grammar and rule-based verifier (a GenEval analogue)."""

from flowrl.worlds.shapes.prompts import TAGS, PromptSpec, eval_prompt_set, parse_prompt, train_prompt_set
from flowrl.worlds.shapes.verifier import dense_score, detect, exact_score, score

__all__ = [
    "TAGS",
    "PromptSpec",
    "dense_score",
    "detect",
    "exact_score",
    "eval_prompt_set",
    "parse_prompt",
    "score",
    "train_prompt_set",
]
