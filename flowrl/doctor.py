"""`flowrl doctor`: does a config's training reward rise on a few prompts that carry signal, and if not, why not?

Four prompts whose groups carry signal, trained for a few dozen updates, are the easiest thing an RL loop can be
asked to learn, and a try costs minutes. This picks K of the config's own prompts by the signal check (the groups
of a few first batches, `flowrl diagnose`'s criterion: a group's std at least SIGNAL_SHARE of the batch's), trains
the config on just those for N updates with its own method, sampler and optimizer, and measures each update:

- the training reward per prompt, and whether it rose: the mean of the last updates against the first, with a 95%
  t interval over those updates' means (the verdict's first line);
- the importance ratio at the first inner step, exp(log pi_theta - log pi_rollout) on the items the update trains,
  before any optimizer step: 1 when rollout and training agree on the log-probs;
- how far the update moved the policy on the transitions it trained: the KL between the rollout policy's step
  Gaussian and the updated one's (both with the sampler's std, so (mu_old - mu_new)^2 / (2 std^2), averaged over
  the latent's elements as flowrl's log-probs are), and the change of log-prob of the samples with positive
  group-relative advantage against those with negative (an update must raise the first and lower the second);
- gradient signal against noise (on the first update and every `probe_every`): the gradients of two halves of the
  update's samples (each group cut in two), whose agreement g_A . g_B estimates the squared signal and whose
  difference the noise (`gradient_terms`), pooled over the probed updates (`gradient_snr`). A deviation from
  comparing the mean of the per-group gradients with their spread: groups of distinct prompts have near-orthogonal
  gradients in a LoRA's thousands of dimensions, and for P orthogonal gradients of equal norm that ratio is exactly
  1 whatever the noise, where two halves of the same groups differ only by their samples' noise. A limit: a group's
  advantages sum to 0, so its two halves weigh the score component its samples share with opposite signs, which
  biases g_A . g_B low where that component is large (a group drawn from one initial noise);
- the share of the groups' reward spread that the sampler's step noise causes (the noise its likelihood credits):
  each prompt's samples from `inits` initial noises, each redrawn `draws` times with only the steps' noise new, and
  mean Var(reward | initial noise) / mean Var(reward | prompt) (0: the initial noise decides the reward, which GRPO's
  likelihood cannot credit; 1: the trained steps decide it all);
- the clipped fraction and the learning rate;

and one line saying which of these looks wrong when the reward does not rise (HINT thresholds below). Runs on one
process, in a temporary run folder: nothing is written beside the config's runs but the report.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from flowrl.diagnose import SIGNAL_SHARE, ZERO_SPREAD

RATIO_OFF = 1e-3  # |ratio - 1| at the first inner step beyond this: rollout and training disagree
BARELY_MOVED = 0.05  # an update whose mean |change of log-prob| is below this share of the clip range barely moved
MOST_CLIPPED = 0.5  # a clipped fraction above this: the steps overshoot the clip range
LITTLE_NOISE_SHARE = 0.1  # the step noise decides less than this share of the spread: little to credit
NOISY_GRADIENT = 1.0  # signal-to-noise below this: the batch gradient is more noise than signal
SCREEN_BATCHES = 3  # batches of the config's own groups drawn to choose the prompts
SCREEN_UPDATE = 1_000_000  # update numbers from here seed the screening batches (apart from the training ones)


@dataclasses.dataclass
class Rise:
    """The training reward's first and last updates: means, difference and its 95% interval's half-width."""

    first: float
    last: float
    gain: float
    half_width: float | None
    window: int

    @classmethod
    def of(cls, per_update: list[float], window: int = 8) -> Rise:
        """Compare the mean of the last `window` updates' rewards with the first `window`'s (fewer when the run has
        under 2 x window updates), Welch's half-width over those updates' means."""
        from flowrl.report import t_quantile

        values = np.asarray(per_update, dtype=np.float64)
        window = max(1, min(window, len(values) // 2))
        a, b = values[:window], values[-window:]
        half = None
        if window >= 2:
            se = math.sqrt(a.var(ddof=1) / window + b.var(ddof=1) / window)
            half = t_quantile(window) * se
        return cls(float(a.mean()), float(b.mean()), float(b.mean() - a.mean()), half, window)

    @property
    def rose(self) -> bool:
        return self.half_width is not None and self.gain - self.half_width > 0

    def line(self) -> str:
        interval = f" +- {self.half_width:.4f}" if self.half_width is not None else ""
        verdict = "rose" if self.rose else "did not rise"
        return (
            f"training reward {verdict}: {self.first:.4f} (updates 1-{self.window}) -> {self.last:.4f} (last "
            f"{self.window}), {self.gain:+.4f}{interval} (95%)"
        )


def noise_share(rewards: np.ndarray) -> float:
    """rewards [P prompts, I initial noises, D redraws of the later noise]: the mean over (prompt, initial noise) of
    the variance over redraws, over the mean over prompts of the variance over all of a prompt's samples (unbiased
    variances both); 0 where the prompts' rewards do not vary at all."""
    rewards = np.asarray(rewards, dtype=np.float64)
    within = rewards.var(axis=2, ddof=1).mean()
    total = rewards.reshape(len(rewards), -1).var(axis=1, ddof=1).mean()
    return float(within / total) if total > 0 else 0.0


def gradient_terms(halves: torch.Tensor) -> tuple[float, float]:
    """halves [2, n]: the flattened gradients of two halves of an update's samples (every group cut in two). With
    g_A = G + n_A and g_B = G + n_B (independent noise of variance s^2 each): (g_A . g_B, an unbiased estimate of
    the signal |G|^2; |g_A - g_B|^2 / 4, of the noise s^2 / 2 of the whole batch's gradient (g_A + g_B) / 2)."""
    a, b = halves.double()
    return float((a * b).sum()), float((a - b).pow(2).sum() / 4)


def gradient_snr(terms: list[tuple[float, float]]) -> float:
    """The batch gradient's signal-to-noise from `gradient_terms` of one or more updates, pooled (each estimate is
    noisy alone): sqrt(sum of signals / sum of noises), 0 where the halves point apart on the whole, inf where they
    agree exactly."""
    signal, noise = (sum(t[i] for t in terms) for i in (0, 1))
    return math.sqrt(max(signal, 0.0) / noise) if noise > 0 else math.inf


def gaussian_kl(mean_old: torch.Tensor, mean_new: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """KL(N(mean_old, std^2) || N(mean_new, std^2)) per row, averaged over the other dimensions (flowrl's log-probs
    are means over the latent's elements)."""
    kl = (mean_old.double() - mean_new.double()) ** 2 / (2 * std.double() ** 2)
    return kl.mean(dim=tuple(range(1, kl.ndim))).float()


class FixedPrompts:
    """Stands in for the run's PromptSource: the same conditions, one group each, every update."""

    def __init__(self, items: list):
        self.items = list(items)
        self.set = SimpleNamespace(by_tag=None, items=self.items)

    def draw(self, count: int, seed: int, update: int) -> list:
        return list(self.items)

    def all(self) -> list:
        return list(self.items)


def transition_terms(trainer, batch, items) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The current policy's step Gaussian (mean, std) and log-prob of `items`' stored transitions, without
    gradients, in memory.microbatch_size chunks."""
    from flowrl.algorithms.grpo import stored_step_terms

    traj, policy, size = batch.trajectory, trainer.policy, trainer.config.memory.microbatch_size
    means, stds, log_probs = [], [], []
    with torch.no_grad(), trainer.accelerator.autocast():
        for start in range(0, len(items), size):
            part = items.subset(torch.arange(start, min(len(items), start + size)))
            *_, mean, std, log_prob = stored_step_terms(policy, traj, part)
            means.append(mean.float().cpu())
            stds.append(torch.as_tensor(std).float().cpu().expand_as(means[-1]))
            log_probs.append(log_prob.float().cpu())
    return torch.cat(means), torch.cat(stds), torch.cat(log_probs)


def half_batch_gradients(trainer, batch, items) -> torch.Tensor:
    """[2, n]: the gradient of the algorithm's loss on each half of the update's samples (every group's samples
    alternately to one half and the other), each half's summed loss over its trained items; [0] where a half
    trains nothing. The parameters' gradients are left at None."""
    groups = batch.group_ids
    first = {int(g): i for i, g in reversed(list(enumerate(groups.tolist())))}
    half_of_sample = (torch.arange(len(groups)) - torch.tensor([first[int(g)] for g in groups])) % 2
    rows = []
    for half in (0, 1):
        part = items.subset(torch.nonzero(half_of_sample[items.sample] == half).flatten())
        if part.trained() == 0:
            return torch.zeros(0)
        with trainer.accelerator.autocast():
            losses, _ = trainer.algorithm.loss(trainer.policy, batch, part)
            loss = (losses * part.weight.to(losses.device)).sum() / part.trained()
        if not loss.requires_grad:
            return torch.zeros(0)
        loss.backward()
        rows.append(torch.cat([p.grad.detach().float().flatten().cpu() for p in trainer.params if p.grad is not None]))
        trainer.optimizer.zero_grad(set_to_none=True)
    return torch.stack(rows)


def choose_prompts(trainer, count: int) -> tuple[list, list[dict]]:
    """`count` conditions whose groups carry the most signal in SCREEN_BATCHES of the config's own batches (a
    group's std at least SIGNAL_SHARE of the screened rewards' std, spread above zero), the largest std first; fewer
    when fewer carry signal. Returns them and every screened group's (prompt, mean, std, carries)."""
    from flowrl.collect import draw_conditions

    screened, rewards = [], []
    for b in range(SCREEN_BATCHES):
        update = SCREEN_UPDATE + b
        batch, _ = trainer.collect(update)
        items = draw_conditions(trainer.prompts, trainer.config, update, 0, 1).items
        size = trainer.config.train.group_size
        for g in range(len(batch.global_rewards) // size):
            row = batch.global_rewards[g * size : (g + 1) * size].double()
            screened.append({"item": items[g * size], "rewards": row})
            rewards.append(row)
    scale = torch.cat(rewards).std(unbiased=False).item()
    best: dict[str, dict] = {}
    for entry in screened:
        row = entry["rewards"]
        std = row.std(unbiased=False).item()
        carries = bool(row.max() - row.min() > ZERO_SPREAD and std >= SIGNAL_SHARE * scale)
        entry.update(prompt=entry["item"].prompt, mean=row.mean().item(), std=std, carries=carries)
        if carries and std > best.get(entry["prompt"], {}).get("std", -1.0):
            best[entry["prompt"]] = entry
    chosen = sorted(best.values(), key=lambda e: -e["std"])[:count]
    table = [{k: e[k] for k in ("prompt", "mean", "std", "carries")} for e in screened]
    return [e["item"] for e in chosen], table


def named_conditions(conditions: list, prompts: list[str]) -> list:
    """The first condition of `conditions` with each of `prompts`; a UserError naming a prompt the set lacks."""
    from flowrl.errors import UserError

    by_prompt = {}
    for item in conditions:
        by_prompt.setdefault(item.prompt, item)
    missing = [p for p in prompts if p not in by_prompt]
    if missing:
        raise UserError(f"--prompt: {missing[0]!r} is not a prompt of the config's prompt set (prompts.source)")
    return [by_prompt[p] for p in prompts]


def measure_noise_share(trainer, items: list, inits: int, draws: int) -> tuple[float, np.ndarray]:
    """The noise share (`noise_share`) of `items` under the run's sampler and its first update's SDE window, and the
    rewards [P, inits, draws]. A sample's reward sees its initial noise's seed, as in training."""
    from flowrl.prompt_source import derived_seed
    from flowrl.rewards.base import score_robustly
    from flowrl.rollout import per_sample_noise, rollout, sample_generators
    from flowrl.sde_window import sde_window

    config, policy, sampler = trainer.config, trainer.policy, trainer.config.sampler
    shape, seed = policy.noise_shape(trainer.spec), config.run.seed
    window = sde_window(sampler, seed, 0)
    table = np.zeros((len(items), inits, draws))
    for p, item in enumerate(items):
        seeds = [derived_seed(seed, SCREEN_UPDATE - 1, p, i) for i in range(inits)]
        initial = per_sample_noise(sample_generators(seeds), shape).repeat_interleave(draws, 0)
        redraws = sample_generators([derived_seed(s, d, 1) for s in seeds for d in range(draws)])
        cond = policy.encode([item] * (inits * draws), sampler.guidance_scale, trainer.spec)
        with torch.no_grad(), trainer.accelerator.autocast():
            traj = rollout(
                policy,
                cond,
                redraws,
                shape,
                sampler.num_steps,
                sampler.kind,
                sampler.noise_level,
                sampler.guidance_scale,
                window,
                initial_noise=initial,
                ode_solver=sampler.ode_solver,
            )
            samples = policy.decode_in_chunks(traj.final)
        meta = {"seeds": [s for s in seeds for _ in range(draws)], "conditions": [item] * (inits * draws)}
        scored, _ = score_robustly(trainer.reward, samples, [item.prompt] * (inits * draws), meta)
        table[p] = scored.scores.double().numpy().reshape(inits, draws)
    return noise_share(table), table


def doctor(
    config,
    updates: int = 40,
    prompts: int = 4,
    inits: int = 4,
    draws: int = 4,
    probe_every: int = 10,
    progress: bool = True,
    screen_seed: int | None = None,
    only: list[str] | None = None,
) -> dict:
    """Choose `prompts` conditions with signal, measure their noise share (`inits` x `draws` samples each; 0 skips
    it), train the config on them for `updates` updates and measure each (see the module docstring). The prompts
    are screened with run seed `screen_seed` (default: the run's own), so runs of several training seeds can share
    their prompts; `only` names the prompts to train instead (conditions of the config's prompt set), unscreened.

    Returns:
        A dict: `prompts` (the chosen ones), `screened` (every screened group), `rise` (Rise as a dict, with `rose`),
        `noise_share`, per-update lists `reward` [updates][prompts], `success` (where the reward has an accuracy),
        `ratio_at_first_step`, `kl`, `logp_change_positive`, `logp_change_negative`, `clip_frac`, `lr`,
        `grad_terms` ({update: gradient_terms}), `config` facts, and `hint`: the line saying what looks wrong.
    """
    from tqdm import tqdm

    from flowrl.algorithms.advantages import group_advantages
    from flowrl.diagnose import accuracy_component
    from flowrl.train import Trainer

    config = dataclasses.replace(
        config,
        train=dataclasses.replace(config.train, updates=updates, groups_per_update=prompts, checkpoint_every=0),
        eval=dataclasses.replace(config.eval, enabled=False),
        runtime=dataclasses.replace(config.runtime, async_rollouts=False),
    )
    result: dict = {key: [] for key in ("reward", "success", "ratio_at_first_step", "kl", "clip_frac", "lr")}
    result.update(logp_change_positive=[], logp_change_negative=[], grad_terms={})
    named = None
    if only:  # checked before the model loads
        from flowrl.prompt_source import PromptSource
        from flowrl.tasks.base import build_task

        named = named_conditions(
            PromptSource(build_task(config.task.name, config.task.params), config.prompts.source).all(), only
        )
    with tempfile.TemporaryDirectory(prefix="flowrl-doctor-") as folder:
        trainer = Trainer(config, run_dir=Path(folder), log=False)
        if named is not None:
            chosen, result["screened"] = named, []
        else:
            if screen_seed is not None:
                trainer.config = dataclasses.replace(config, run=dataclasses.replace(config.run, seed=screen_seed))
            chosen, result["screened"] = choose_prompts(trainer, prompts)
            trainer.config = config
        if not chosen:
            result.update(prompts=[], hint="no screened group carries signal: change the testbed, not the recipe")
            return result
        if len(chosen) < prompts:  # train what carries signal, one group each
            result["asked_prompts"] = prompts
            config = dataclasses.replace(config, train=dataclasses.replace(config.train, groups_per_update=len(chosen)))
            trainer.config = config
        trainer.prompts = FixedPrompts(chosen)
        result["prompts"] = [item.prompt for item in chosen]
        if trainer.algorithm.shared_initial_noise:  # a group's samples share x_T: the steps decide all its spread
            result["noise_share"], table = 1.0, None
        else:
            result["noise_share"], table = measure_noise_share(trainer, chosen, inits, draws) if inits else (None, None)
        result["noise_share_rewards"] = None if table is None else table.tolist()
        stochastic, size = None, config.train.group_size
        for update in tqdm(range(updates), desc="doctor", disable=not progress):
            batch, metrics = trainer.collect(update)
            result["reward"].append(batch.global_rewards.view(-1, size).mean(1).tolist())
            accuracy = accuracy_component(batch.reward_info or {})
            if accuracy is not None:
                result["success"].append((accuracy > 0.5).float().view(-1, size).mean(1).tolist())
            with trainer.accelerator.autocast():
                items, _ = trainer.algorithm.prepare(batch, trainer.policy)
            stochastic = batch.trajectory.stochastic
            scored = items.subset(torch.nonzero(stochastic[items.step]).flatten()) if len(items) else items
            if len(scored):
                mean_old, std, logp_before = transition_terms(trainer, batch, scored)
                rollout_logp = batch.trajectory.log_probs[scored.step, scored.sample].float().cpu()
                result["ratio_at_first_step"].append(torch.exp(logp_before - rollout_logp).mean().item())
            if probe_every and update % probe_every == 0 and len(items):
                halves = half_batch_gradients(trainer, batch, items)
                if len(halves):
                    result["grad_terms"][update] = gradient_terms(halves)
            step_metrics = trainer.optimize(batch, items, update) if len(items) else {}
            result["clip_frac"].append(step_metrics.get("clip_frac"))
            result["lr"].append(trainer.optimizer.param_groups[0]["lr"])
            if len(scored):
                mean_new, _, logp_after = transition_terms(trainer, batch, scored)
                result["kl"].append(gaussian_kl(mean_old, mean_new, std).mean().item())
                advantage = group_advantages(batch.global_rewards, batch.global_group_ids)[scored.sample]
                change = logp_after - logp_before
                for key, side in (("logp_change_positive", advantage > 0), ("logp_change_negative", advantage < 0)):
                    result[key].append(change[side].mean().item() if side.any() else None)
            trainer.state.update += 1
        result["config"] = {
            "algorithm": config.algorithm.name,
            "sampler": config.sampler.kind,
            "noise_level": config.sampler.noise_level,
            "num_steps": config.sampler.num_steps,
            "group_size": config.train.group_size,
            "lr": config.optim.lr,
            "clip_range": getattr(trainer.algorithm.params, "clip_range", None),
            "stochastic_steps": None if stochastic is None else int(stochastic.sum()),
        }
    rise = Rise.of([float(np.mean(r)) for r in measured(result)])
    result["rise"] = dataclasses.asdict(rise) | {
        "rose": rise.rose,
        "of": "success share" if result["success"] else "reward",
    }
    result["hint"] = hint(result)
    return result


def measured(result: dict) -> list:
    """What the verdict measures, per update and prompt: the success share where the reward has one, else the
    reward."""
    return result["success"] or result["reward"]


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def _pooled_snr(result: dict) -> float | None:
    return gradient_snr(list(result["grad_terms"].values())) if result["grad_terms"] else None


def hint(result: dict) -> str:
    """The one line saying which figure looks wrong, the first that does in the order a reward's failure to rise is
    best looked for (the thresholds are the module's constants)."""
    ratio, kl, clip = _mean(result["ratio_at_first_step"]), _mean(result["kl"]), _mean(result["clip_frac"])
    up, down = _mean(result["logp_change_positive"]), _mean(result["logp_change_negative"])
    clip_range, share = result["config"]["clip_range"], result.get("noise_share")
    snr = _pooled_snr(result)
    if ratio is not None and abs(ratio - 1) > RATIO_OFF:
        return (
            f"the ratio at the first inner step is {ratio:.4f}, not 1: rollout and training disagree on the "
            "log-probs (precision, guidance or conditioning differ between them)"
        )
    if up is not None and down is not None and up <= down:
        return (
            f"updates lower the positive-advantage samples' log-prob against the negative ones' ({up:+.2e} vs "
            f"{down:+.2e}): the loss does not push where the advantages say (a sign, or steps the adapter skips)"
        )
    rise = result["rise"]
    if rise.get("half_width") is not None and rise["gain"] + rise["half_width"] < 0:
        decays = "" if result["lr"][-1] < result["lr"][0] else ", or let it decay: optim.lr_schedule=cosine"
        return (
            f"the training reward fell ({rise['gain']:+.3f}): the steps are too large for the gradient's noise "
            f"(lower optim.lr, {result['lr'][0]:.1e} at the start{decays})"
        )
    if share is not None and share < LITTLE_NOISE_SHARE:
        return (
            f"the sampler's step noise decides {share:.0%} of the groups' reward spread: the initial noise decides the "
            "rest, which the likelihood cannot credit (train earlier steps, widen the SDE window, raise "
            "sampler.noise_level)"
        )
    if clip is not None and clip > MOST_CLIPPED:
        return f"{clip:.0%} of items clip: the steps overshoot (lower optim.lr or take fewer optimizer steps)"
    moved = None if up is None or down is None else (abs(up) + abs(down)) / 2
    if moved is not None and clip_range and moved < BARELY_MOVED * clip_range:
        return (
            f"an update changes a trained step's log-prob by {moved:.1e}, {moved / clip_range:.1%} of the clip range: "
            f"the policy barely moves (raise optim.lr, now {result['lr'][-1]:.1e})"
        )
    if snr is not None and snr < NOISY_GRADIENT:
        return (
            f"gradient signal-to-noise {snr:.2f}: the batch's gradient is more noise than signal (more samples per "
            "update: train.group_size or train.groups_per_update)"
        )
    if rise["rose"]:
        return "nothing looks wrong"
    kl_text = f" (KL per update {kl:.1e})" if kl is not None else ""
    return f"no figure looks wrong{kl_text}: train longer, or raise optim.lr"


def summary_lines(result: dict) -> list[str]:
    """What the command prints: the verdict first, one line a figure, the hint last."""
    if not result.get("prompts"):
        return [f"verdict: {result['hint']}"]
    rise, config = result["rise"], result["config"]
    lines = [Rise(**{k: rise[k] for k in ("first", "last", "gain", "half_width", "window")}).line()]
    if rise["of"] == "success share":
        lines[0] = lines[0].replace("training reward", "training success share")
    lines.append(f"prompts ({len(result['prompts'])}, chosen for signal): " + "; ".join(result["prompts"]))
    if result.get("asked_prompts"):
        lines.append(f"  only {len(result['prompts'])} of the {result['asked_prompts']} asked for carry signal")
    last = np.asarray(measured(result)[-rise["window"] :]).mean(0)
    first = np.asarray(measured(result)[: rise["window"]]).mean(0)
    for prompt, a, b in zip(result["prompts"], first, last):
        lines.append(f"  {prompt[:60]:60s} {a:.4f} -> {b:.4f}")
    figures = [
        ("ratio at the first inner step", _mean(result["ratio_at_first_step"]), "{:.5f}"),
        ("KL(rollout || updated) per update", _mean(result["kl"]), "{:.2e}"),
        ("log-prob change, positive advantage", _mean(result["logp_change_positive"]), "{:+.2e}"),
        ("log-prob change, negative advantage", _mean(result["logp_change_negative"]), "{:+.2e}"),
        (
            "gradient signal-to-noise",
            gradient_snr(list(result["grad_terms"].values())) if result["grad_terms"] else None,
            "{:.2f}",
        ),
        ("noise share of the groups' spread", result.get("noise_share"), "{:.2f}"),
        ("clipped fraction", _mean(result["clip_frac"]), "{:.1%}"),
    ]
    for name, value, form in figures:
        lines.append(f"{name}: {'n/a' if value is None else form.format(value)}")
    lines.append(
        f"lr {result['lr'][0]:.1e} -> {result['lr'][-1]:.1e}; {config['algorithm']}, {config['sampler']} sampler "
        f"(noise {config['noise_level']}, {config['stochastic_steps']} of {config['num_steps']} steps stochastic), "
        f"groups of {config['group_size']}"
    )
    lines.append(f"what looks wrong: {result['hint']}")
    return lines


def write_report(result: dict, out: Path) -> list[Path]:
    """doctor.json, doctor.md (the printed lines) and doctor.png (the reward per prompt per update; the KL and the
    log-prob changes per update) in `out`."""
    from flowrl.report import figure

    out.mkdir(parents=True, exist_ok=True)
    (out / "doctor.json").write_text(json.dumps(result, indent=1))
    (out / "doctor.md").write_text("\n".join(summary_lines(result)) + "\n")
    written = [out / "doctor.json", out / "doctor.md"]
    if not result.get("prompts"):
        return written
    with figure(out / "doctor.png", 1, 2, figsize=(11, 3.8)) as (fig, (left, right)):
        rewards = np.asarray(measured(result))
        for p, prompt in enumerate(result["prompts"]):
            left.plot(range(1, len(rewards) + 1), rewards[:, p], lw=1, label=prompt[:32])
        left.plot(range(1, len(rewards) + 1), rewards.mean(1), color="black", lw=2, label="mean")
        left.set_xlabel("update")
        left.set_ylabel(result["rise"]["of"])
        left.legend(fontsize=6)
        updates = range(1, len(result["kl"]) + 1)
        for key, label in (("logp_change_positive", "positive advantage"), ("logp_change_negative", "negative")):
            values = [np.nan if v is None else v for v in result[key]]
            right.plot(updates, values, lw=1, label=f"log-prob change, {label}")
        right.axhline(0, color="grey", lw=0.5)
        right.set_xlabel("update")
        right.set_ylabel("change of log-prob on the trained steps")
        twin = right.twinx()
        twin.plot(updates, result["kl"], color="black", lw=1, ls=":", label="KL")
        twin.set_ylabel("KL(rollout || updated)")
        right.legend(fontsize=6, loc="upper left")
        fig.suptitle(summary_lines(result)[0], fontsize=9)
    return [*written, out / "doctor.png"]
