"""The task contract: what a config's `task.name` names.

A task owns everything specific to it: its condition sets (each item a prompt plus optional per-sample inputs such
as a source image or control maps, and metadata a reward or evaluation reads), its evaluation (per-tag and overall
metrics), its pretraining data for data losses, and its config defaults. The loop, rollouts, configs and reports
only ever see this contract; tasks are found by name or dotted path through `TASKS`.

A task is not a world: `prompt_file` is a task with no world behind it, while each embedded world under
flowrl/worlds/ (shapes, shapes3d, moving_shapes, shapes_edit, safety) provides a task of its own name beside its
renderer, verifier, models and pretraining recipes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from flowrl.errors import ConfigError, UserError
from flowrl.registry import Registry


@dataclass(frozen=True)
class Condition:
    """One condition item: a prompt, optional per-sample inputs for the policy (arrays or tensors, e.g.
    "source_image", "control_image"), and metadata for rewards and evaluation (e.g. "tag", GenEval fields)."""

    prompt: str
    inputs: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    def key(self) -> tuple[str, str]:
        """What tells conditions apart: the prompt and the metadata (one instruction on two source images is two
        conditions): a group rubric's group, an evaluation's cluster, a reward batch's unbroken run."""
        return self.prompt, repr(sorted(self.meta.items()))


def condition_runs(items: list[Condition]) -> list[int]:
    """Boundaries of the runs of consecutive equal conditions (Condition.key): [0, ..., len(items)], run r being
    items[bounds[r]:bounds[r + 1]] (a group of a rollout, a condition's samples of an evaluation)."""
    return [0] + [i for i in range(1, len(items)) if items[i].key() != items[i - 1].key()] + [len(items)]


@dataclass
class ConditionSet:
    """A named set of conditions a run draws from (training prompts, an eval split)."""

    items: list[Condition]
    by_tag: dict[str, list[Condition]] | None = None  # when set, draws pick a tag first, then an item within it


def tagged_set(prompts_by_tag: dict[str, list[str]]) -> ConditionSet:
    """A condition set drawn tag first, then a prompt within the tag, so every tag gets the same share."""
    by_tag = {tag: [Condition(p) for p in prompts] for tag, prompts in prompts_by_tag.items()}
    return ConditionSet([c for items in by_tag.values() for c in items], by_tag)


class Task:
    """The task contract. Subclasses set `name`, `set_names` and optionally `metric_name` and `defaults`, and
    override what they offer; register with `@TASKS.register(name)`. The base is a task with no sets, no
    evaluation of its own and no pretraining data.

    Args:
        **params: `task.params` of the config; the base takes none (a ConfigError names any given).
    """

    name = "task"
    metric_name = "reward"  # what `evaluate` reports, shown in reports
    set_names: tuple[str, ...] = ()
    defaults: dict = {}  # config sections merged under a YAML config that names this task

    def __init__(self, **params):
        if params:
            raise ConfigError(f"task.params: task {self.name!r} takes no parameters, got {sorted(params)}")

    def condition_set(self, name: str) -> ConditionSet:
        """The task's set `name` (one of `set_names`); ConfigError otherwise.

        Args:
            name: the set's name (e.g. "train", "eval").

        Returns:
            The ConditionSet (drawn tag first where it has `by_tag`).
        """
        raise ConfigError(
            f"{name!r} is not a set of task {self.name!r} (sets: {list(self.set_names)}) nor an "
            "existing prompt file (.txt, one prompt per line, or .jsonl with a 'prompt' field)"
        )

    def check(self, item: Condition) -> None:
        """Raise ValueError saying why when the task's evaluation cannot judge `item` (checked before sampling).

        Args:
            item: a condition about to be sampled (e.g. a prompt outside the task's grammar fails).
        """

    @classmethod
    def commands(cls):
        """The task's own CLI commands (pretraining recipes, evaluation suites, sampling options).

        Returns:
            A `flowrl.cli.TaskCommands`, or None when the task adds no command.
        """
        return None

    def eval_steer(self, policy):
        """The in-generation guidance applied to the run's evaluation samples.

        Args:
            policy: the policy that samples the evaluation.

        Returns:
            An inference.Steer, or None (plain sampling).
        """
        return None

    def judges_samples(self) -> bool:
        """Whether the task has an evaluation of its own (`evaluate` overridden), else runs report their reward."""
        return type(self).evaluate is not Task.evaluate

    def evaluate(self, samples, conditions: list[Condition]) -> dict | None:
        """Judge samples with the task's own evaluation.

        Args:
            samples: the N decoded samples, a Samples object (`to_uint8()`: images or clips; `grids()`: 3D SDF
                grids).
            conditions: the N condition items they were sampled from.

        Returns:
            {'overall': float, 'tags': {tag: float}, 'counts': {tag: int}} (tag_metrics' shape, with 'stderr' where
            the task computes it), or None when the task has none (the run's reward is reported instead).
        """
        return None

    def data_batch(self, count: int, rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
        """Pretraining pairs for data losses (train.data_loss); ConfigError when the task has no data.

        Args:
            count: how many pairs.
            rng: the generator to draw them with (seeded by the loop, so a resumed run draws the same ones).

        Returns:
            (uint8 images [count, H, W, 3], count prompts).
        """
        raise ConfigError(f"train.data_loss: task {self.name!r} has no pretraining data")


class GrammarTask(Task):
    """A task whose prompts come from a grammar: a tagged training set drawn tag first (`train_prompts()`:
    {tag: prompts}), a held-out eval list (`eval_prompts()`) and a parser that names a prompt outside the grammar
    (`parse`, raising ValueError) as the task's check. Subclasses set the three as staticmethods."""

    set_names = ("train", "eval")
    train_prompts = eval_prompts = parse = None

    def condition_set(self, name: str) -> ConditionSet:
        if name == "train":  # every tag gets the same share
            return tagged_set(self.train_prompts())
        if name == "eval":
            return ConditionSet([Condition(p) for p in self.eval_prompts()])
        return super().condition_set(name)

    def check(self, item: Condition) -> None:
        self.parse(item.prompt)


TASKS = Registry(
    "task",
    {
        "prompt_file": "flowrl.tasks.base",
        "shapes": "flowrl.worlds.shapes.task",
        "safety": "flowrl.worlds.safety.task",
        "moving_shapes": "flowrl.worlds.moving_shapes.task",
        "shapes3d": "flowrl.worlds.shapes3d.task",
        "shapes_edit": "flowrl.worlds.shapes_edit.task",
        "tactile": "flowrl.worlds.tactile.task",
    },
)


def build_task(name: str, params: dict | None = None) -> Task:
    """The task `task.name` names (a registered name or `package.module:Class`), built with `task.params`."""
    return TASKS.get(name, "task.name")(**(params or {}))


@TASKS.register("prompt_file")
class PromptFileTask(Task):
    """Prompts from files only; evaluation reports the run's reward."""

    name = "prompt_file"


def read_prompt_file(path: str | Path) -> list[Condition]:
    """Conditions from a .txt file (one prompt per line; blank and # lines skipped) or a .jsonl file (one object per
    line with a 'prompt' string; its other fields become the condition's metadata, a relative 'image' path, or each
    of a list of them, taken from the file's folder)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(
            f"prompt file {path} does not exist; expected a .txt file with one prompt per line or a "
            ".jsonl file with a 'prompt' field per line"
        )
    suffix = path.suffix.lower()
    if suffix == ".json":  # a JSON array or JSON lines under another name: reading it as text would lose every field
        raise UserError(
            f"prompt file {path}: expected a .jsonl file (one JSON object with a 'prompt' field per line) "
            "or a .txt file (one prompt per line); rename it if its lines are JSON objects"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise UserError(
            f"prompt file {path} is not UTF-8 text (byte {error.start}); expected one prompt per line"
        ) from None
    lines = [(n, line.strip()) for n, line in enumerate(text.splitlines(), start=1)]
    lines = [(n, line) for n, line in lines if line and not line.startswith("#")]
    items = []
    for number, line in lines:
        if suffix != ".jsonl":
            items.append(Condition(line))
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
            raise UserError(f"{path} line {number}: expected a JSON object with a 'prompt' string")
        image = record.get("image")
        if image is not None and not (
            isinstance(image, str) or (isinstance(image, list) and image and all(isinstance(i, str) for i in image))
        ):
            raise UserError(
                f"{path} line {number}: 'image' must be a file path or a list of file paths (a source "
                "image, then further reference images)"
            )
        if image is not None:  # named relative to the prompt file, not the cwd; absolute: a reward server elsewhere
            record["image"] = (
                [str((path.parent / i).absolute()) for i in image]
                if isinstance(image, list)
                else str((path.parent / image).absolute())
            )
        items.append(Condition(record.pop("prompt"), meta=record))
    if not items:
        raise UserError(f"prompt file {path} has no prompts")
    return items


def check_source(task: Task, source: str, where: str) -> None:
    """ConfigError naming `where` unless `source` is a set of the task or an existing prompt file."""
    if source not in task.set_names and not Path(source).is_file():
        raise ConfigError(
            f"{where}: {source!r} is not a set of task {task.name!r} (sets: {list(task.set_names)}) "
            "nor an existing prompt file (.txt, one prompt per line, or .jsonl with a 'prompt' field)"
        )


def condition_set(task: Task, source: str) -> ConditionSet:
    """A named set of the task, or the conditions of a prompt file."""
    if source in task.set_names:
        return task.condition_set(source)
    if Path(source).suffix in (".txt", ".jsonl") or Path(source).is_file():
        return ConditionSet(read_prompt_file(source))
    return task.condition_set(source)


def tag_metrics(
    values: list[float], tags: list[str], tag_order: tuple[str, ...] | None = None, clusters: list | None = None
) -> dict:
    """{'overall': mean of the per-tag means, 'tags', 'counts', 'stderr'}: the one shape every evaluation reports.

    'stderr' holds the standard error of each tag mean and of the overall (tags independent: sqrt(sum SE_t^2) / T).
    `clusters` (e.g. each value's prompt) makes it cluster-robust: samples of one prompt are correlated (the same
    prompt is easy or hard for every seed), so the prompt is the sampling unit, not the image: how far the score
    could move on other prompts of the same kinds. With `clusters`, 'draw_stderr' holds the same with the prompts
    fixed and only the images random (prompts as strata): how far another draw of seeds could move the score on
    these prompts, the noise that decides whether two runs judged on this eval differ. A 95% interval is +- 1.96 SE.

    A value that is not finite (a sample its reward failed to score, e.g. a judge that answered neither yes nor no)
    is left out of every figure and counted under 'failed' (present only when some failed), as training drops
    failed groups: one NaN would otherwise make its tag, the overall and every interval NaN."""
    x = np.asarray(values, dtype=np.float64)
    by_tag: dict[str, list[int]] = {}
    failed: dict[str, int] = {}
    for index, tag in enumerate(tags):
        if np.isfinite(x[index]):
            by_tag.setdefault(tag, []).append(index)
        else:
            failed[tag] = failed.get(tag, 0) + 1
    order = [t for t in (tag_order or sorted(by_tag)) if t in by_tag]
    keys = list(clusters) if clusters is not None else list(range(len(x)))
    means = {t: float(np.mean(x[by_tag[t]])) for t in order}
    errors = {t: clustered_stderr(x[by_tag[t]], [keys[i] for i in by_tag[t]]) for t in order}
    # a tag whose every sample failed leaves the overall unknown (a mean over fewer tags is another quantity)
    whole_tag_failed = any(t not in by_tag for t in failed)
    overall = float("nan") if whole_tag_failed else float(np.mean(list(means.values()))) if means else 0.0
    result = {
        "overall": overall,
        "tags": means,
        "counts": {t: len(by_tag[t]) for t in order},
        "stderr": _tag_errors(errors),
    }
    if failed:
        result["failed"] = failed
    if clusters is not None:
        result["draw_stderr"] = _tag_errors(
            {t: stratified_stderr(x[by_tag[t]], [keys[i] for i in by_tag[t]]) for t in order}
        )
    return result


def _tag_errors(errors: dict) -> dict:
    """{'overall', 'tags'}: the tags' standard errors and the overall's (the tags independent)."""
    overall = float(np.sqrt(sum(e**2 for e in errors.values())) / len(errors)) if errors else 0.0
    return {"overall": overall, "tags": errors}


def stratified_stderr(values: np.ndarray, strata: list) -> float:
    """Standard error of the mean of `values` with the strata (e.g. prompts) fixed and the values within each random:
    sqrt(sum_s n_s^2 var_s / n_s) / n, var_s the unbiased variance within stratum s (0 for a single value). NaN
    where no stratum holds two values (one image per prompt): nothing tells the draw's noise, which is not 0."""
    groups: dict = {}
    for v, s in zip(np.asarray(values, dtype=np.float64), strata):
        groups.setdefault(s, []).append(v)
    if values is not None and len(values) and not any(len(g) > 1 for g in groups.values()):
        return float("nan")
    total = sum(len(g) * np.var(g, ddof=1) for g in groups.values() if len(g) > 1)
    return float(np.sqrt(total) / len(values)) if len(values) else 0.0


def clustered_stderr(values: np.ndarray, clusters: list) -> float:
    """Standard error of the mean of `values` with `clusters` as independent units (CR1 sandwich estimator:
    sqrt(C / (C - 1) sum_c (sum_{i in c} (x_i - mean))^2) / n); one value per cluster gives the usual s / sqrt(n).
    NaN for fewer than two clusters (a tag with one prompt): nothing estimates how other prompts would score, which
    is not 0 (as stratified_stderr says of a draw it cannot estimate)."""
    groups: dict = {}
    residual = np.asarray(values, dtype=np.float64) - np.mean(values)
    for r, c in zip(residual, clusters):
        groups[c] = groups.get(c, 0.0) + r
    count = len(groups)
    if count < 2:
        return float("nan")
    return float(np.sqrt(count / (count - 1) * sum(v**2 for v in groups.values())) / len(residual))


def interval(result: dict, tag: str | None = None, key: str = "stderr") -> float:
    """The 95% half-width (1.96 SE) of a tag_metrics result's overall (or of `tag`), 0 when it has no SE, NaN where
    nothing estimates it (read back from JSON: null)."""
    stderr = result.get(key)
    if not stderr:
        return 0.0
    value = stderr["overall"] if tag is None else stderr["tags"].get(tag, 0.0)
    return float("nan") if value is None else 1.96 * value


def format_metrics(result: dict, label: str = "score") -> str:
    """The per-tag table, with 95% intervals (+-1.96 SE) where the result has standard errors: '95% +-' with the
    prompt (cluster) as the sampling unit, and 'draw +-' with the prompts fixed (another draw of seeds), where given;
    an 'exact' column where the result has a stricter verdict beside its headline (the shapes suite's)."""
    show, draw, exact = "stderr" in result, "draw_stderr" in result, result.get("exact")

    def spread(tag=None):
        text = f" {interval(result, tag):>8.3f}" if show else ""
        if draw:
            text += f" {interval(result, tag, 'draw_stderr'):>8.3f}"
        return text

    def strict(tag=None):
        return "" if not exact else f" {exact['overall'] if tag is None else exact['tags'][tag]:>8.3f}"

    header = f"{'tag':<14} {label:>8}" + (f" {'95% +-':>8}" if show else "") + (f" {'draw +-':>8}" if draw else "")
    lines = [header + (f" {'exact':>8}" if exact else "") + f" {'n':>5}"]
    for tag, value in result["tags"].items():
        lines.append(f"{tag:<14} {value:>8.3f}{spread(tag)}{strict(tag)} {result['counts'][tag]:>5}")
    lines.append(f"{'overall':<14} {result['overall']:>8.3f}{spread()}{strict()}")
    if result.get("failed"):
        lines.append(
            "left out, the reward failed on them: " + ", ".join(f"{n} {t}" for t, n in result["failed"].items())
        )
    return "\n".join(lines)
