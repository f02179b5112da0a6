"""TVRL (Token-Level Video Reinforcement Learning): token-level credit for video flow RL from a frozen,
differentiable question scorer.

No arXiv id given by the source, and no public code: this is flowrl's reading of the method's description, on
top of GRPO (grpo.py: Flow-GRPO, arXiv 2505.05470; DanceGRPO, arXiv 2505.07818).

GRPO's group-relative advantage A from R = mean_q p(yes | video, q), with each trained step's log-density split into
per-token terms and reweighted by where the scorer looks:
1. credit maps (detached): g_q = d log p(yes | V, q) / dV on the decoded frames (the VAE decoder is not
   differentiated), m_{q,k} = mean |g_q| over token k's pixels (its latent frame's pixel frames, its spatial patch),
   w_{q,k} = m_{q,k} / mean_k m_{q,k}; w_k = mean_q w_{q,k} (uniform over the prompt's questions);
   w_k <- clip((1 - gamma) + gamma w_k, w_min, w_max), renormalised to mean 1.
2. loss: l_{t,k} = mean over token k's latent elements of log N(x_{t-1}; mu_theta(x_t), sigma_t^2);
   l~_t = sum_k w_k l_{t,k} / sum_k w_k, rho_t = exp(l~_t^theta - l~_t^old), and GRPO's clipped surrogate on rho_t.
   `token_ratio: true` instead clips per token: sum_k w_k max(-A rho_{t,k}, -A clip(rho_{t,k})) / sum_k w_k.
With w = 1 both are GRPO's loss (to float rounding: the mean of per-token means is the mean over elements).
The old per-token log-densities are recomputed in `prepare` (no gradient, the rollout's policy): one extra forward
per trained step.

Deviations from that reading:
- The credit maps weigh the prompt's questions uniformly (per-question weights, e.g. by per-question advantages,
  are not implemented) and are computed once per rollout.
- `token_ratio: true` (per-token ratios and clipping) is an option beside the description's one reweighted ratio.
- No KL term and terminal credit only: TVRLParams.validate refuses GRPO's `kl_beta` and `credit: incremental`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flowrl.algorithms.base import RolloutBatch, WorkItems, register_algorithm
from flowrl.algorithms.grpo import GRPO, GRPOParams, clipped_surrogate
from flowrl.errors import ConfigError
from flowrl.sde import gaussian_log_prob


@dataclass
class TVRLParams(GRPOParams):
    gamma: float = 0.5
    """Smoothing towards uniform credit, w <- (1 - gamma) + gamma w, in [0, 1]."""
    w_min: float = 0.2
    """Lower clip of the token weights (renormalised to mean 1 after clipping), in (0, 1]."""
    w_max: float = 5.0
    """Upper clip of the token weights (>= 1)."""
    token_ratio: bool = False
    """Per-token ratios and clipping instead of one ratio of the reweighted log-density."""
    credit_batch: int = 8
    """Samples per scorer backward when computing the credit maps (>= 1)."""
    max_scored_frames: int = 16
    """Frames of a clip the question scorers see when the credit maps are computed, evenly spaced, first and last
    included (>= 2); a longer clip's other frames get no credit of their own. Bounds the scorers' memory on long
    videos."""

    def validate(self):
        super().validate()
        if not 0 <= self.gamma <= 1 or not 0 < self.w_min <= 1 <= self.w_max:
            raise ConfigError(
                "algorithm.params: expected 0 <= gamma <= 1 and 0 < w_min <= 1 <= w_max, got "
                f"gamma {self.gamma}, w_min {self.w_min}, w_max {self.w_max}"
            )
        if self.credit_batch < 1:
            raise ConfigError(f"algorithm.params.credit_batch: expected an integer >= 1, got {self.credit_batch}")
        if self.max_scored_frames < 2:
            raise ConfigError(
                f"algorithm.params.max_scored_frames: expected an integer >= 2, got {self.max_scored_frames}"
            )
        if self.kl_beta or self.credit != "terminal":
            raise ConfigError(
                "algorithm.params: tvrl keeps GRPO's terminal credit without a KL term (kl_beta: 0, credit: terminal)"
            )


def token_geometry(policy) -> tuple[int, int, tuple[int, int, int]]:
    """(temporal compression, spatial compression, transformer patch (t, h, w)) of a video policy."""
    if getattr(policy, "modality", "image") != "video":
        raise ConfigError("algorithm.name: tvrl credits video tokens; the pipeline samples images")
    pipe, config = policy.pipeline, policy.transformer.config
    # Wan and HunyuanVideo name the VAE's compressions vae_scale_factor_*, LTX-Video vae_*_compression_ratio
    temporal = getattr(pipe, "vae_scale_factor_temporal", None) or pipe.vae_temporal_compression_ratio
    spatial = getattr(pipe, "vae_scale_factor_spatial", None) or pipe.vae_spatial_compression_ratio
    patch = config.patch_size  # Wan: (t, h, w); HunyuanVideo and LTX-Video: the spatial side, and patch_size_t
    if not isinstance(patch, (tuple, list)):
        patch = (config.get("patch_size_t", 1), patch, patch)
    return temporal, spatial, tuple(patch)


def pixels_to_tokens(
    magnitude: torch.Tensor, latent_frames: int, temporal: int, spatial: int, patch: tuple[int, int, int]
) -> torch.Tensor:
    """Mean of a per-pixel map [B, F, H, W] over each token's pixels -> [B, F'/pt, H/(s ph), W/(s pw)].

    Frames follow the causal video VAE (Wan): latent frame 0 is pixel frame 0, latent frame j >= 1 pixel frames
    (j - 1) t + 1 .. j t; a token spans `pt` latent frames and ph x pw latent pixels, i.e. s ph x s pw pixels."""
    b, f, h, w = magnitude.shape
    groups = [magnitude[:, :1]] + [
        magnitude[:, 1 + (j - 1) * temporal : 1 + j * temporal] for j in range(1, latent_frames)
    ]
    per_latent = torch.stack([g.mean(1) for g in groups], 1)  # [B, F', H, W]
    pt, ph, pw = patch
    pooled = torch.nn.functional.avg_pool2d(per_latent.flatten(0, 1)[:, None], (spatial * ph, spatial * pw))
    pooled = pooled.view(b, latent_frames, *pooled.shape[-2:])
    return pooled.view(b, latent_frames // pt, pt, *pooled.shape[-2:]).mean(2)


def token_log_probs(element_log_probs: torch.Tensor, patch: tuple[int, int, int]) -> torch.Tensor:
    """Per-element log-densities [N, C, F', H', W'] -> per-token means [N, F'/pt, H'/ph, W'/pw]."""
    n, c, f, h, w = element_log_probs.shape
    pt, ph, pw = patch
    x = element_log_probs.view(n, c, f // pt, pt, h // ph, ph, w // pw, pw)
    return x.mean(dim=(1, 3, 5, 7))


def smooth_weights(raw: torch.Tensor, gamma: float, w_min: float, w_max: float) -> torch.Tensor:
    """[B, K] credit (mean 1 per sample) -> clip((1 - gamma) + gamma w, w_min, w_max), renormalised to mean 1."""
    w = ((1 - gamma) + gamma * raw).clamp(w_min, w_max)
    return w / w.mean(1, keepdim=True)


def scored_frames(num_frames: int, most: int) -> torch.Tensor | None:
    """Indices of at most `most` evenly spaced frames of a clip, first and last included (None: all of them)."""
    if num_frames <= most:
        return None
    return torch.linspace(0, num_frames - 1, most).round().long()


@register_algorithm
class TVRL(GRPO):
    name = "tvrl"
    Params = TVRLParams
    # per-token old log-densities are recomputed in prepare, not stored by the rollout
    refuses_stale_rollouts = (
        "takes its ratio's old log-densities from the current policy, so batches sampled with older weights would go "
        "uncorrected"
    )

    def bind_reward(self, reward) -> None:
        from flowrl.rewards.questions import QuestionScorer

        terms = getattr(reward, "rewards", [reward])
        weights = getattr(reward, "weights", [1.0] * len(terms))
        scorers = [(term, abs(float(w))) for term, w in zip(terms, weights) if isinstance(term, QuestionScorer)]
        if not scorers:
            raise ConfigError(
                "reward: algorithm 'tvrl' takes its credit maps from a question-answering reward "
                "(e.g. moving_shapes_qa); none of the configured rewards answers questions"
            )
        total = sum(w for _, w in scorers)
        # every question reward credits tokens, weighted as the reward weighs it (equally when all weigh 0)
        self.scorers = [(s, w / total if total > 0 else 1 / len(scorers)) for s, w in scorers]
        self.reward = reward

    def credit_maps(self, policy, batch: RolloutBatch) -> torch.Tensor:
        """Raw per-token credit [B, K], mean 1 per sample (before smoothing): per question reward the mean over its
        valid questions of |d log p(yes) / d pixels| pooled per token (each map mean 1), then the rewards' weighted
        mean."""
        temporal, spatial, patch = token_geometry(policy)
        final = batch.trajectory.final
        maps = []
        for start in range(0, final.shape[0], self.params.credit_batch):
            rows = slice(start, start + self.params.credit_batch)
            with torch.no_grad():
                video = policy.decode(final[rows]).float()
            video.requires_grad_(True)
            frames = scored_frames(video.shape[2], self.params.max_scored_frames)
            combined = 0
            for scorer, weight in self.scorers:
                with torch.enable_grad():
                    seen = video if frames is None else video[:, :, frames]
                    log_yes, valid = scorer.question_log_yes(seen, batch.prompts[rows])
                    per_question = []
                    for q in range(log_yes.shape[1]):
                        (grad,) = torch.autograd.grad(log_yes[:, q].sum(), video, retain_graph=q + 1 < log_yes.shape[1])
                        m = pixels_to_tokens(grad.abs().mean(1), final.shape[2], temporal, spatial, patch).flatten(1)
                        per_question.append(m / m.mean(1, keepdim=True).clamp(min=1e-20))
                stacked = torch.stack(per_question, 1)  # [b, Q, K]
                mask = valid.float().unsqueeze(-1)
                combined = combined + weight * ((stacked * mask).sum(1) / mask.sum(1).clamp(min=1)).detach().cpu()
            maps.append(combined)
        return torch.cat(maps)

    def prepare(self, batch: RolloutBatch, policy=None):
        items, metrics = super().prepare(batch, policy)
        p = self.params
        self.token_weights = smooth_weights(self.credit_maps(policy, batch), p.gamma, p.w_min, p.w_max)
        with torch.no_grad():  # the rollout policy's per-token log-densities of the trained transitions
            self.old_token_log_probs = (
                torch.cat(
                    [
                        self.token_terms(policy, batch.trajectory, items.subset(part))
                        for part in torch.arange(len(items)).split(p.credit_batch)
                    ]
                )
                if len(items)
                else torch.zeros(0)
            )
        metrics["credit_max_over_mean"] = self.token_weights.max(1).values.mean().item()
        return items, metrics

    def token_terms(self, policy, traj, items: WorkItems) -> torch.Tensor:
        """Per-token log-densities [N, K] of the stored transitions under the current policy."""
        x_next = traj.latents[items.step + 1, items.sample]
        *_, mean, std, _ = self.step_terms(policy, traj, items)
        _, _, patch = token_geometry(policy)
        return token_log_probs(gaussian_log_prob(x_next, mean, std, reduce="none"), patch).flatten(1)

    def loss(self, policy, batch: RolloutBatch, items: WorkItems):
        p = self.params
        new = self.token_terms(policy, batch.trajectory, items)
        old = self.old_token_log_probs[items.key].to(new.device)
        w = self.token_weights[items.sample].to(new.device)
        advantage = self.advantages[items.sample].to(new.device)
        if p.token_ratio:
            ratio = torch.exp(new - old)
            losses = (w * clipped_surrogate(ratio, advantage[:, None], p.clip_range)).sum(1) / w.sum(1)
            ratio_seen = (w * ratio).sum(1) / w.sum(1)
        else:
            ratio_seen = torch.exp((w * new).sum(1) / w.sum(1) - (w * old).sum(1) / w.sum(1))
            losses = clipped_surrogate(ratio_seen, advantage, p.clip_range)
        diagnostics = {
            "ratio": ratio_seen.detach(),
            "clip_frac": ((ratio_seen - 1).abs() > p.clip_range).float().detach(),
        }
        return losses, diagnostics
