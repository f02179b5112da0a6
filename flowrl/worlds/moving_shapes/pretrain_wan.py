"""Pretrain `pipelines/shapes-wan` from scratch on rendered moving-shapes clips.

The shapes-sd3 recipe's two stages on video: (1) the AutoencoderKLWan, its causal convolutions inflated from
per-frame ones, learns to reconstruct frames (object-weighted L1 + a small KL term; optionally then whole clips) and
its per-channel latent statistics become `latents_mean` / `latents_std` (the normalisation WanPipeline applies);
(2) the Wan transformer and the UMT5 encoder learn rectified-flow matching on normalised latents with logit-normal t
and 10% caption dropout, through the shared pretraining loop (EMA weights saved).

The choices below were measured on this world; the figures are in docs/research/code_notes.md and
docs/research/video.md.
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
from tqdm import tqdm

from flowrl.policies.wan_vae import frame_convolutions, frames_independent, past_taps
from flowrl.pretrain_progress import GeneratorState
from flowrl.schedules import cosine_decay, sample_noise_levels
from flowrl.sde import time_shift
from flowrl.worlds.moving_shapes.model_wan import FRAMES, SIZE, WAN_SEQUENCE_LENGTH, ShapesWanSize, build_pipeline
from flowrl.worlds.moving_shapes.world import (
    render_clip,
    render_shape_labels,
    sample_pairs,
    sample_tracks,
)
from flowrl.worlds.shapes.pretrain_sd3 import train_denoiser
from flowrl.worlds.shapes.tokenizer import SPECIAL_TOKENS
from flowrl.worlds.shapes.world import SHAPES


@dataclass
class WanPretrainConfig:
    seed: int = 0
    vae_steps: int = 1500
    vae_batch: int = 64  # frames per stage-1 step
    vae_clip_steps: int = 0
    vae_clip_batch: int = 8
    vae_lr: float = 1e-3
    vae_object_weight: float = 9.0  # extra L1 weight on object pixels (they are ~10% of a frame)
    # pixels the object weight reaches past an object's edge; 1 made reconstructions exact but samples worse (below)
    vae_weight_dilation: int = 0
    vae_kl_weight: float = 1e-6
    # weight of a shape-class loss on the latents (`ShapeProbe`): each latent pixel's shape (background, circle,
    # square, triangle) read linearly from the standardised latents, so shape is a feature of the latents' own size,
    # as colour is; the flow stage drew the prompt's colour but rounded blobs whatever the shape word
    vae_shape_weight: float = 0.0
    flow_steps: int = 15000
    flow_batch: int = 32
    flow_pool: int = 2048  # clips whose latents are kept (LatentPool)
    flow_refresh: int = 8  # clips re-rendered and encoded per step
    flow_image_batch: int = 0  # first frames trained as one-frame videos beside each step's clips (train_video_flow)
    flow_image_weight: float = 1.0
    # an image stage before the video one: steps of single frames as one-frame videos (off by default: for the same
    # total steps it scored below video steps alone)
    flow_image_steps: int = 0
    flow_image_stage_batch: int = 256  # frames per image-stage step (a frame costs the transformer 1/9 of a clip)
    flow_lr: float = 1.2e-3
    # extra flow-loss weight on latent pixels that differ from the black background's latent (objects and a one-pixel
    # halo, see object_mask): the shape word barely acted with the plain loss, where object pixels are a small share
    flow_object_weight: float = 0.0
    # weight of a bag-of-words loss on the text encoder's outputs: every prompt token's output predicts (a linear head,
    # discarded after training) which words the whole prompt holds. Without it, a colour word moved the
    # outputs of every position, a shape word only its own, and the samples followed the colour but not the shape
    flow_text_words_weight: float = 0.0
    warmup_steps: int = 100
    caption_dropout: float = 0.1
    ema_decay: float = 0.995
    threads: int = 2


def clips_to_tensor(clips: np.ndarray) -> torch.Tensor:
    """uint8 [B, F, H, W, 3] -> float [B, 3, F, H, W] in [-1, 1]."""
    return torch.from_numpy(clips).permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0


def decode_unclamped(vae, z: torch.Tensor) -> torch.Tensor:
    """AutoencoderKLWan's decode without its final clamp to [-1, 1]: the clamp has no gradient below -1, so a
    decoder that overshoots the black background (most of every frame) gets none there and settles on black frames,
    every object lost (no reconstruction passed the verifier). Same causal frame-by-frame
    loop with the feature cache as diffusers' `_decode` (no tiling, no patching: shapes-wan uses neither)."""
    vae.clear_cache()
    x = vae.post_quant_conv(z)
    frames = []
    for i in range(z.shape[2]):
        vae._conv_idx = [0]
        frames.append(
            vae.decoder(x[:, :, i : i + 1], feat_cache=vae._feat_map, feat_idx=vae._conv_idx, first_chunk=i == 0)
        )
    vae.clear_cache()
    return torch.cat(frames, 2)


def inflate_causal_convs(vae) -> None:
    """Zero every causal 3-D convolution's past taps (keep the current frame's), so the VAE starts as a per-frame
    image autoencoder: frames after the first then go through the same function as the first. Trained directly on
    clips, Wan's causal VAE reconstructed objects poorly; trained on single frames it learned them quickly, but that
    did not carry to later frames until the past taps start at zero (the image-to-video inflation of video VAEs)."""
    with torch.no_grad():
        for taps in past_taps(vae):
            taps.zero_()


class ShapeProbe(torch.nn.Module):
    """Per-latent-pixel shape class from latents [N, C, F, h, w], standardised per channel over the batch, along
    unit-length class directions at a fixed scale. A free linear probe could read the class from a latent feature
    far smaller than the error a flow model leaves; with unit directions over standardised latents, a confident
    answer needs the classes to sit about a channel's spread apart."""

    def __init__(self, channels: int, classes: int, scale: float = 4.0):
        super().__init__()
        self.directions = torch.nn.Parameter(torch.randn(classes, channels) / channels**0.5)
        self.bias = torch.nn.Parameter(torch.zeros(classes))
        self.scale = scale

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        mean = z.mean((0, 2, 3, 4), keepdim=True)
        std = z.std((0, 2, 3, 4), keepdim=True) + 1e-6
        w = torch.nn.functional.normalize(self.directions, dim=1) * self.scale
        return torch.einsum("kc,ncfhw->nkfhw", w, (z - mean) / std) + self.bias.view(1, -1, 1, 1, 1)


def shape_targets(labels: np.ndarray, latent_size: int, classes: int) -> torch.Tensor:
    """Shape labels [N, F, H, W] -> each latent pixel's share of every class [N, classes, F, h, w]."""
    one_hot = torch.nn.functional.one_hot(torch.from_numpy(labels), classes).permute(0, 4, 1, 2, 3).float()
    k = labels.shape[-1] // latent_size
    return torch.nn.functional.avg_pool3d(one_hot, (1, k, k))


def train_video_vae(vae, cfg: WanPretrainConfig, rng: np.random.Generator) -> dict:
    """Stage 1: frames as one-frame videos (batch `vae_batch` frames), on the inflated VAE; stage 2 (optional):
    whole clips, where the past taps may learn."""
    inflate_causal_convs(vae)
    classes = 1 + len(SHAPES)
    probe = ShapeProbe(vae.config.z_dim, classes) if cfg.vae_shape_weight else None
    params = list(vae.parameters()) + (list(probe.parameters()) if probe is not None else [])
    optimizer = torch.optim.AdamW(params, lr=cfg.vae_lr, weight_decay=0.0)
    shape_accuracy = None
    vae.train()
    total = cfg.vae_steps + cfg.vae_clip_steps
    # constant, then a cosine over the last fifth: the frame loss plateaus for a while before it drops, and a
    # cosine over the whole run had taken the rate away by then
    tail = max(1, total // 5)
    bar = tqdm(range(total), desc="pretrain video vae", mininterval=5)
    for step in bar:
        tracks, _ = sample_tracks(-(-cfg.vae_batch // FRAMES) if step < cfg.vae_steps else cfg.vae_clip_batch, rng)
        clips = clips_to_tensor(np.stack([render_clip(t) for t in tracks]))
        labels = np.stack([render_shape_labels(t) for t in tracks]) if probe is not None else None
        if step < cfg.vae_steps:  # frames: [N, 3, 1, H, W] (labels [N, 1, H, W])
            clips = clips.permute(0, 2, 1, 3, 4).flatten(0, 1)[: cfg.vae_batch, :, None]
            labels = None if labels is None else labels.reshape(-1, 1, *labels.shape[2:])[: cfg.vae_batch]
        # frame steps run the causal convolutions as 2-D ones (same function, faster; clip steps may move the past
        # taps, so they take the full path)
        with frame_convolutions(vae) if step < cfg.vae_steps else contextlib.nullcontext():
            posterior = vae.encode(clips).latent_dist
            # the posterior mean, not a sample: with a sampled latent (posterior std ~1 at init) the decoder settled
            # on black frames; and the decode without Wan's final clamp, which has no gradient below -1
            reconstruction = decode_unclamped(vae, posterior.mode())
        error = (reconstruction - clips).abs()
        l1 = error.mean()
        # objects cover ~10% of a frame: unweighted, the decoder settled on black frames; weighting object pixels
        # 10x lets it learn them
        objects = (clips.max(1, keepdim=True).values > -0.9).float()
        # weighting only object pixels makes colour bleeding past an edge 10x cheaper than falling short of it: the
        # decoder grows objects outward and circles fill their boxes. The weight one pixel past the edge
        # (vae_weight_dilation 1) reconstructs exactly, but the same flow stage on that VAE sampled ragged shapes and
        # passed fewer eval clips, so the blunter decoder stays the default
        if cfg.vae_weight_dilation:
            k = 2 * cfg.vae_weight_dilation + 1
            objects = torch.nn.functional.max_pool3d(
                objects, (1, k, k), stride=1, padding=(0, cfg.vae_weight_dilation, cfg.vae_weight_dilation)
            )
        loss = (error * (1 + cfg.vae_object_weight * objects)).mean() + cfg.vae_kl_weight * posterior.kl().mean()
        if probe is not None:
            z = posterior.mode()
            target = shape_targets(labels, z.shape[-1], classes)
            log_p = torch.log_softmax(probe(z), 1)
            # object latent pixels weighted as object pixels are in the L1 term (background is ~85% of them)
            weight = 1 + cfg.vae_object_weight * (1 - target[:, :1])
            loss = loss + cfg.vae_shape_weight * (-(target * log_p).sum(1, keepdim=True) * weight).mean()
            objects_there = target[:, 0] < 0.5
            shape_accuracy = (log_p.argmax(1) == target.argmax(1))[objects_there].float().mean().item()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for group in optimizer.param_groups:
            group["lr"] = cfg.vae_lr * cosine_decay(max(0, step - (total - tail)), tail)
        optimizer.step()
        if step % 20 == 0:
            shown = {} if shape_accuracy is None else {"shape": f"{shape_accuracy:.2f}"}
            bar.set_postfix(l1=f"{l1.item():.4f}", **shown)
    vae.eval()
    with torch.no_grad(), frame_convolutions(vae):
        latents = torch.cat(
            [vae.encode(clips_to_tensor(sample_pairs(32, rng)[0])).latent_dist.mode() for _ in range(4)]
        )
    channels = latents.transpose(0, 1).flatten(1)
    mean, std = channels.mean(1).tolist(), channels.std(1).tolist()
    vae.register_to_config(latents_mean=mean, latents_std=std)
    facts = {
        "vae_final_l1": l1.item(),
        "latents_mean": mean,
        "latents_std": std,
        "vae_reconstruction_accuracy": reconstruction_accuracy(vae, np.random.default_rng(cfg.seed + 99)),
    }
    if shape_accuracy is not None:  # the probe's accuracy on the object latent pixels of the last batch
        facts["vae_shape_probe_accuracy"] = shape_accuracy
    return facts


@torch.no_grad()
def reconstruction_accuracy(vae, rng: np.random.Generator, count: int = 96) -> float:
    """The video verifier's accuracy on VAE reconstructions of rendered clips: the ceiling the pipeline can reach."""
    from flowrl.worlds.moving_shapes.verifier import judge_clip

    clips, prompts = sample_pairs(count, rng)
    with frame_convolutions(vae):
        decoded = torch.cat(
            [
                vae.decode(vae.encode(clips_to_tensor(clips[i : i + 16])).latent_dist.mode()).sample
                for i in range(0, count, 16)
            ]
        )
    frames = ((decoded.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 4, 1).numpy()
    return float(np.mean([judge_clip(c, p)[0] for c, p in zip(frames, prompts)]))


def encode_mean(vae, x: torch.Tensor) -> torch.Tensor:
    """The posterior mean of clips [B, 3, F, H, W]. A frame-independent VAE encodes all B x F frames as one batch of
    one-frame videos, the same latents as its causal frame loop at a fraction of the cost."""
    if not frames_independent(vae):
        return vae.encode(x).latent_dist.mode()
    b, c, f, h, w = x.shape
    z = vae.encode(x.transpose(1, 2).reshape(b * f, c, 1, h, w)).latent_dist.mode()
    return z.view(b, f, *z.shape[1:2], *z.shape[3:]).transpose(1, 2)


def normalised_latents(vae, clips: np.ndarray) -> torch.Tensor:
    """Clips -> the latents the transformer sees: (z - latents_mean) / latents_std (WanPipeline's normalisation),
    z the posterior mean (the autoencoder was trained on it)."""
    with torch.no_grad():
        z = encode_mean(vae, clips_to_tensor(clips))
    c = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean).view(1, c, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, c, 1, 1, 1)
    return (z - mean) / std


def object_mask(latents: torch.Tensor, background: torch.Tensor, threshold: float = 1.0) -> torch.Tensor:
    """[B, 1, F, h, w] float mask of latent pixels whose channels differ from the background latent [C] by more than
    `threshold` (normalised units). With the recipe's VAE it holds every object pixel plus a halo of about one
    latent pixel."""
    return ((latents - background.view(1, -1, 1, 1, 1)).abs().amax(1, keepdim=True) > threshold).float()


class LatentPool:
    """Normalised latents of rendered clips, encoded once and refreshed `refresh` at a time per draw (oldest first):
    encoding clips costs more than a transformer step on them, so each clip serves several steps; with refresh r
    and batch b a clip is drawn about b / r times."""

    def __init__(self, vae, size: int, refresh: int, rng: np.random.Generator):
        self.vae, self.refresh, self.next = vae, refresh, 0
        chunks = [sample_pairs(min(64, size - i), rng) for i in range(0, size, 64)]
        self.latents = torch.cat([normalised_latents(vae, clips) for clips, _ in chunks])
        self.prompts = [p for _, prompts in chunks for p in prompts]

    def state_dict(self) -> dict:
        return {"latents": self.latents, "prompts": list(self.prompts), "next": self.next}

    def load_state_dict(self, state: dict) -> None:
        self.latents, self.prompts, self.next = state["latents"].clone(), list(state["prompts"]), state["next"]

    def __call__(self, n: int, rng: np.random.Generator):
        if self.refresh:
            clips, prompts = sample_pairs(self.refresh, rng)
            slots = [(self.next + i) % len(self.prompts) for i in range(self.refresh)]
            self.latents[slots] = normalised_latents(self.vae, clips)
            for slot, prompt in zip(slots, prompts):
                self.prompts[slot] = prompt
            self.next = (self.next + self.refresh) % len(self.prompts)
        index = rng.choice(len(self.prompts), size=n, replace=False)
        return self.latents[index], [self.prompts[i] for i in index]

    def frames(self, n: int, rng: np.random.Generator):
        """One random frame of each of `n` drawn clips, as one-frame videos [n, C, 1, h, w], with its clip's prompt."""
        clips, prompts = self(n, rng)
        frame = torch.from_numpy(rng.integers(0, clips.shape[2], size=n))
        return clips[torch.arange(n), :, frame][:, :, None], prompts


def prompt_words_loss(tokenizer, head: torch.nn.Module, prompts: list[str], embeds: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of `head`'s prediction, from each real token's text-encoder output (embeds [B, L, D],
    L = WAN_SEQUENCE_LENGTH), of which words the whole prompt holds (special tokens excluded), averaged over real
    tokens."""
    ids = tokenizer(
        prompts, padding="max_length", max_length=embeds.shape[1], truncation=True, return_tensors="pt"
    ).input_ids
    words = torch.zeros(len(prompts), len(tokenizer)).scatter_(1, ids, 1.0)
    words[:, : len(SPECIAL_TOKENS)] = 0.0
    real = (ids != SPECIAL_TOKENS.index("<pad>")).float()
    per_token = torch.nn.functional.binary_cross_entropy_with_logits(
        head(embeds), words[:, None].expand(-1, ids.shape[1], -1), reduction="none"
    ).mean(-1)
    return (per_token * real).sum() / real.sum()


def train_video_flow(
    pipe, cfg: WanPretrainConfig, rng: np.random.Generator, generator: torch.Generator, progress=None
) -> dict:
    """Rectified flow on pooled clip latents; optionally (joint image-video training, as real video models train) a
    batch of `flow_image_batch` first frames as one-frame videos with their clips' prompts, since a frame costs the
    transformer ~1/9 of a clip (16 tokens against 144). Off by default: the frames of sampled clips became
    independent samples (objects jump between frames). `progress`: train_denoiser's, for both stages."""
    with frame_convolutions(pipe.vae):
        pool = LatentPool(pipe.vae, cfg.flow_pool, cfg.flow_refresh, rng)
        if cfg.flow_object_weight:  # the black background's latent, per channel
            background = normalised_latents(pipe.vae, np.zeros((1, FRAMES, SIZE, SIZE, 3), np.uint8)).mean((0, 2, 3, 4))
    shift = pipe.scheduler.config.shift
    words_head = (
        torch.nn.Linear(pipe.text_encoder.config.d_model, len(pipe.tokenizer)) if cfg.flow_text_words_weight else None
    )

    def denoising_loss(x0, embeds):
        t = sample_noise_levels("logit_normal", len(x0), generator)  # as SD3 and Wan train
        t = time_shift(t, shift)  # under the pipeline's own time shift (ShapesWanSize.flow_shift)
        noise = torch.randn(x0.shape, generator=generator)
        tt = t.view(-1, 1, 1, 1, 1)
        xt = (1 - tt) * x0 + tt * noise
        velocity = pipe.transformer(
            hidden_states=xt, timestep=t * 1000, encoder_hidden_states=embeds, return_dict=False
        )[0]
        error = (velocity - (noise - x0)).pow(2)
        if not cfg.flow_object_weight:
            return error.mean()
        weight = 1 + cfg.flow_object_weight * object_mask(x0, background)
        return (error * weight).sum() / (weight.sum() * error.shape[1])

    def batch_loss(latents, prompts):
        clips, frames = latents
        embeds, _ = pipe.encode_prompt(
            prompts,
            do_classifier_free_guidance=False,
            max_sequence_length=WAN_SEQUENCE_LENGTH,
            device=torch.device("cpu"),
        )
        loss = denoising_loss(clips, embeds[: len(clips)])
        if words_head is not None:
            loss = loss + cfg.flow_text_words_weight * prompt_words_loss(pipe.tokenizer, words_head, prompts, embeds)
        if len(frames):
            loss = loss + cfg.flow_image_weight * denoising_loss(frames, embeds[len(clips) :])
        return loss

    def pairs(n, rng):
        with frame_convolutions(pipe.vae):
            clips, prompts = pool(n, rng)
        index = rng.choice(len(pool.prompts), size=cfg.flow_image_batch, replace=False)
        return (clips, pool.latents[index, :, :1]), prompts + [pool.prompts[i] for i in index]

    def frame_pairs(n, rng):
        with frame_convolutions(pipe.vae):
            frames, prompts = pool.frames(n, rng)
        return (frames, frames[:0]), prompts

    modules = [pipe.transformer, pipe.text_encoder] + ([words_head] if words_head is not None else [])
    resumable = {"progress": progress, "streams": {"pool": pool, "generator": GeneratorState(generator)}}
    facts = {}
    if cfg.flow_image_steps:
        # real video models learn appearance from images first; here nine times the samples per step go to the
        # prompt's shape and colour before the clips teach motion (each stage its own warm-up, cosine and EMA).
        # At this budget it did not help the shape word.
        image_cfg = replace(cfg, flow_steps=cfg.flow_image_steps, flow_batch=cfg.flow_image_stage_batch)
        facts["flow_image_final_loss"] = train_denoiser(
            modules, batch_loss, image_cfg, rng, "pretrain image flow", pairs=frame_pairs, **resumable
        )
    facts["flow_final_loss"] = train_denoiser(
        modules, batch_loss, cfg, rng, "pretrain video flow", pairs=pairs, **resumable
    )
    return facts


def pretrain_shapes_wan(cfg: WanPretrainConfig, size: ShapesWanSize | None = None, progress=None):
    """Train a shapes-wan pipeline from scratch; returns (pipeline, training facts for the model card). `progress` (a
    PretrainProgress): each stage saves into it, and a run given the same progress continues where it stopped."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    size = size or ShapesWanSize()
    if (cfg.flow_image_steps or cfg.flow_image_batch) and size.temporal_patch != 1:
        raise ValueError(
            f"flow_image_steps / flow_image_batch train one-frame videos, which a transformer with "
            f"temporal_patch {size.temporal_patch} cannot patchify: use temporal_patch 1"
        )
    pipe = build_pipeline(size, seed=cfg.seed)
    started = time.monotonic()
    clock = progress.seconds if progress is not None else lambda: time.monotonic() - started
    facts = {"config": asdict(cfg), "size": asdict(size)}

    def vae_stage() -> dict:
        begun = clock()
        vae_facts = train_video_vae(pipe.vae, cfg, rng)
        return {**vae_facts, "vae_minutes": (clock() - begun) / 60}

    facts.update(progress.stage("video vae", [pipe.vae], vae_stage) if progress is not None else vae_stage())
    # the latent statistics live in the VAE's config, not its weights: a stage loaded from progress needs them set
    pipe.vae.register_to_config(latents_mean=facts["latents_mean"], latents_std=facts["latents_std"])
    # the flow stage draws from its own streams (seed + 1), so it can be rerun alone on a saved stage-1 VAE and give
    # the same weights
    flow_rng, flow_generator = np.random.default_rng(cfg.seed + 1), torch.Generator().manual_seed(cfg.seed + 1)
    facts.update(train_video_flow(pipe, cfg, flow_rng, flow_generator, progress))
    facts["total_minutes"] = clock() / 60
    facts["flow_minutes"] = facts["total_minutes"] - facts["vae_minutes"]
    pipe.to(torch.float16)
    return copy.deepcopy(pipe), facts
