"""StableDiffusionPipeline adapter: an epsilon-prediction UNet sampled with DDIM (the policy DDPO trains).

Schedule points are the scheduler's DDIM timesteps, with -1 standing for the end of sampling (where the
"previous" cumulative alpha is the scheduler's final_alpha_cumprod). `velocity` returns the guided noise
prediction eps_u + w (eps_c - eps_u); `step` is a DDIM step with eta = noise_level (eta = 0 for 'ode').
"""

from __future__ import annotations

import torch

from flowrl.policies import POLICIES
from flowrl.policies.base import Conditioning, FlowPolicy, SampleSpec
from flowrl.sde import ddim_step

SD_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


@POLICIES.register("StableDiffusionPipeline")
class SDPolicy(FlowPolicy):
    family = "sd"
    prediction = "epsilon"
    kinds = ("ode", "ddim")
    lora_targets = SD_LORA_TARGETS
    sampler_scheduler = "DDIMScheduler"  # PNDM (SD 1.5's default) repeats a timestep; DDIM on its config does not

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], guidance_scale: float) -> Conditioning:
        cfg = self.uses_cfg(guidance_scale)
        embeds, neg = self.pipeline.encode_prompt(
            prompts, self.device, 1, cfg, negative_prompt=[""] * len(prompts) if cfg else None
        )
        return Conditioning({"embeds": embeds}, {"embeds": neg} if cfg else {}, list(prompts))

    def _forward(self, latents, timestep, tensors, guidance_scale):
        out = self.net()(
            latents, timestep, encoder_hidden_states=tensors["embeds"].to(latents.dtype), return_dict=False
        )[0]
        return self.as_epsilon(out, latents, timestep)

    def as_epsilon(self, out: torch.Tensor, latents: torch.Tensor, timestep) -> torch.Tensor:
        """The network's output as the noise prediction every step and loss here reads, for the scheduler's
        prediction_type (SD 2.x's 768 models predict v = sqrt(a) eps - sqrt(1 - a) x0; ddpo-pytorch's DDIM step
        converts the same way)."""
        kind = self.scheduler.config.get("prediction_type", "epsilon")
        if kind == "epsilon":
            return out
        a = self.alpha_prod(timestep).to(latents.device)
        a = a.reshape(-1, *[1] * (latents.ndim - 1)) if a.ndim else a
        x = latents.float()
        if kind == "v_prediction":
            eps = torch.sqrt(a) * out.float() + torch.sqrt(1 - a) * x
        elif kind == "sample":
            eps = (x - torch.sqrt(a) * out.float()) / torch.sqrt(1 - a)
        else:
            raise ValueError(f"scheduler prediction_type {kind!r}: expected epsilon, v_prediction or sample")
        return eps.to(out.dtype)

    def noise_shape(self, spec: SampleSpec) -> tuple[int, ...]:
        factor = self.pipeline.vae_scale_factor
        return (self.transformer.config.in_channels, spec.height // factor, spec.width // factor)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipeline.vae
        return self.to_images(vae.decode(latents.to(vae.dtype) / vae.config.scaling_factor, return_dict=False)[0])

    def sigmas(self, num_steps: int, noise_shape: tuple[int, ...] = ()) -> torch.Tensor:
        key = (num_steps, "ddim")
        if key not in self._sigma_cache:
            scheduler = self.scheduler.__class__.from_config(self.scheduler.config)
            scheduler.set_timesteps(num_steps)
            self._sigma_cache[key] = torch.cat([scheduler.timesteps.float(), torch.tensor([-1.0])])
        return self._sigma_cache[key]

    def alpha_prod(self, timestep) -> torch.Tensor:
        """Cumulative alpha at DDIM timesteps (final_alpha_cumprod at -1), fp32."""
        scheduler = self.scheduler
        t = torch.as_tensor(timestep, dtype=torch.float32)
        table = scheduler.alphas_cumprod.float().to(t.device)  # (a model's timesteps sit on its device)
        final = torch.as_tensor(scheduler.final_alpha_cumprod, dtype=torch.float32, device=t.device)
        return torch.where(t >= 0, table[t.clamp(min=0).long()], final)

    def step(
        self,
        kind,
        x,
        timestep,
        timestep_next,
        cond,
        guidance_scale,
        noise_level,
        noise=None,
        prev_sample=None,
        guide=None,
    ):
        if kind not in self.kinds:
            raise ValueError(f"epsilon-prediction pipelines sample with {self.kinds}, not {kind!r}")
        eps = self.velocity(x, timestep, cond, guidance_scale)
        if guide is not None:
            eps = guide(x, timestep, cond, guidance_scale, eps)
        a_t, a_prev = self.alpha_prod(timestep).to(x.device), self.alpha_prod(timestep_next).to(x.device)
        eta = noise_level if kind == "ddim" else 0.0
        out = ddim_step(eps, x, a_t, a_prev, eta, noise=noise, prev_sample=prev_sample)
        shaped = a_t.reshape(-1, *[1] * (x.ndim - 1)) if a_t.ndim else a_t
        return (*out, (x.float() - torch.sqrt(1 - shaped) * eps) / torch.sqrt(shaped))
