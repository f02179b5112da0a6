"""Tasks, what a config's `task.name` names: condition sets, evaluation, pretraining data and defaults, registered by
name (loaded on first use) or given as a dotted path. The embedded worlds (flowrl/worlds/) each provide one."""

from flowrl.tasks.base import TASKS, Condition, ConditionSet, Task, build_task, condition_set, read_prompt_file

__all__ = ["TASKS", "Condition", "ConditionSet", "Task", "build_task", "condition_set", "read_prompt_file"]
