"""The config sections the training loop reads: `train` (what an update is), `optim` (the optimizer), `memory` (how
the run fits the machine) and `runtime` (threads, processes and overlap). Each field is documented by the string
under it, from which docs/guide/configuration.md is generated (flowrl/config_docs.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from flowrl.errors import ConfigError


@dataclass
class DataLossSection:
    """Pretraining-data regularization (ImageReward's ReFL): weight x the flow-matching loss on a batch of the
    task's pretraining data, added at every optimizer step. It needs a flow-matching policy that encodes images
    and a task with pretraining data; elsewhere it is a config error."""

    weight: float = 1.0
    """The loss's weight (>= 0)."""
    batch: int = 32
    """Pretraining samples per optimizer step (>= 1)."""

    def validate(self):
        if self.weight < 0 or self.batch < 1:
            raise ConfigError(
                f"train.data_loss: expected weight >= 0 and batch >= 1, got {self.weight} and {self.batch}"
            )


@dataclass
class TrainSection:
    """What an update is: how many there are, the samples each draws and how its loss is made; checkpoints."""

    updates: int = 40
    """Number of updates (>= 1)."""
    groups_per_update: int = 8
    """Prompts (groups) per update, over all processes (>= 1)."""
    group_size: int = 8
    """Samples per prompt (>= 2: group advantages need it)."""
    optimizer_steps_per_update: int = 1
    """Optimizer steps per update, each on its share of one global shuffle of the batch (>= 1)."""
    normalize_rewards: Literal["none", "batch", "group"] = "none"
    """`batch`: standardize each reward term over the gathered batch before weighting; `group`: within each prompt
    group (with GRPO's `std: global` this is GDPO, a multi-reward advantage); `none`: the raw weighted sum."""
    cfg_uncond_grad: bool | None = None
    """Gradient through CFG's unconditional branch: false drops it (the default of likelihood-ratio methods: GRPO,
    DDPO, NFT, DHO, DPO, as Flow-GRPO's SD3 script detaches it), true keeps it (the default of methods that
    differentiate the sampler: DRaFT, ReFL, MEND, whose gradient is the guided output's); null: the method's
    default."""
    max_failed_reward_share: float = 0.25
    """Samples of an update without a finite reward (NaN, inf, raised) beyond this share stop the run with a
    checkpoint; below it their groups are skipped (on several processes, when that leaves one process no sample,
    nobody trains on that update: `update_skipped` in metrics.csv)."""
    data_loss: DataLossSection | None = None
    """Regularize with the pretraining data's loss (below); null: off."""
    checkpoint_every: int = 10
    """Updates between checkpoints (0: only the last, and on an interrupt)."""
    keep_checkpoints: int = 2
    """Checkpoints kept in the run folder (older ones are deleted)."""

    def validate(self):
        for name in ("updates", "groups_per_update", "optimizer_steps_per_update"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name}: expected an integer >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ConfigError(
                f"train.group_size: expected an integer >= 2 (group advantages need it), got {self.group_size}"
            )
        if self.data_loss is not None:
            self.data_loss.validate()


@dataclass
class OptimSection:
    """The optimizer over the trained weights, its schedule, gradient clipping and the weights' EMA."""

    optimizer: Literal["adamw", "adamw_8bit", "sgd"] = "adamw"
    """`adamw`, `adamw_8bit` (bitsandbytes, CUDA) or `sgd` (momentum = `adam_betas[0]`)."""
    lr: float = 3e-4
    """Learning rate (> 0)."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """`constant`, or `cosine`: from `lr` down to 0 at the last update."""
    weight_decay: float = 1e-4
    """Decoupled weight decay (>= 0)."""
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """Adam's two betas, each in [0, 1) (SGD takes the first as its momentum)."""
    grad_clip: float = 1.0
    """The largest gradient norm; larger gradients are scaled down to it (> 0)."""
    ema_decay: float = 0.0
    """EMA of the trained weights, in [0, 1); evaluations and sampling use the EMA weights. 0: no EMA."""

    def validate(self):
        if self.lr <= 0:
            raise ConfigError(f"optim.lr: expected a positive number, got {self.lr}")
        if self.weight_decay < 0:
            raise ConfigError(f"optim.weight_decay: expected a number >= 0, got {self.weight_decay}")
        if len(self.adam_betas) != 2 or not all(0 <= b < 1 for b in self.adam_betas):
            raise ConfigError(f"optim.adam_betas: expected two numbers in [0, 1), got {self.adam_betas}")
        if self.grad_clip <= 0:  # 0 would zero every gradient, a negative norm flip its sign
            raise ConfigError(f"optim.grad_clip: expected a positive gradient norm, got {self.grad_clip}")
        if not 0 <= self.ema_decay < 1:
            raise ConfigError(f"optim.ema_decay: expected a number in [0, 1), got {self.ema_decay}")


@dataclass
class MemorySection:
    """How the run fits in memory: batch cuts, recomputation, offloading, caching and precision. The cuts change no
    result beyond float rounding, and a resumed run may change them; the two precision settings change the
    numbers."""

    microbatch_size: int = 16
    """Samples per forward / backward in the update phase (>= 1)."""
    rollout_microbatch: int = 0
    """Samples per rollout call (0: all of a process's samples); also per call of the run's evaluations and per
    no-grad forward of NFT's, DHO's and DPO's old velocities (0 there: 64). Not with FK rollouts or intermediate
    rewards."""
    decode_microbatch: int = 0
    """Samples per VAE decode (0: all at once)."""
    reward_microbatch: int = 0
    """Samples per reward call (0: all at once)."""
    gradient_checkpointing: bool = False
    """Recompute the denoiser's activations in backward (memory for time)."""
    offload_text_encoders: bool = False
    """Text encoders on the CPU except while encoding (never placed on the device with the rest)."""
    embedding_cache: bool = False
    """Encode each distinct prompt once per run, kept in host memory (repeated prompts skip the encoders)."""
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"
    """Autocast precision of forward passes: `no`, `fp16` or `bf16` (a bare YAML `no` is read as `no`)."""
    weight_dtype: Literal["fp32", "fp16", "bf16"] = "fp32"
    """Precision of the frozen weights (base model, VAE, text encoders); trained weights stay fp32. Other than fp32
    it needs the same `mixed_precision`."""

    def validate(self):
        if self.microbatch_size < 1:
            raise ConfigError(f"memory.microbatch_size: expected an integer >= 1, got {self.microbatch_size}")
        for name in ("rollout_microbatch", "decode_microbatch", "reward_microbatch"):
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"memory.{name}: expected an integer >= 0 (0: all at once), got {getattr(self, name)}"
                )
        if self.weight_dtype != "fp32" and self.mixed_precision != self.weight_dtype:
            raise ConfigError(
                f"memory.weight_dtype: {self.weight_dtype} weights run under autocast; expected "
                f"memory.mixed_precision: {self.weight_dtype}, got {self.mixed_precision!r}"
            )


@dataclass
class RuntimeSection:
    """How the run uses threads and processes: overlapped rewards and rollouts, CPU threads, collective timeouts."""

    async_rewards: bool = False
    """Score each rollout chunk in a worker thread while the next chunk samples (needs
    `memory.rollout_microbatch`)."""
    async_rollouts: bool = False
    """A worker thread samples and scores upcoming updates on its own copy of the policy, loaded with a weight
    snapshot, while the learner trains; under LoRA the copy shares every frozen weight and owns only its adapter.
    One process only."""
    staleness: int = 1
    """With `async_rollouts`: update u's batch is sampled with the weights after update max(0, u - staleness); 0
    gives synchronous training bit for bit. The snapshots pending batches need are saved with each checkpoint, so a
    resume is exact."""
    threads: int = 0
    """Torch CPU threads; 0 keeps torch's default."""
    compile: bool = False
    """`torch.compile` the denoisers' forward (inductor) for rollouts, updates and evaluations: the first call of each
    input shape and adapter state compiles (seconds on the embedded models, minutes on a large one) and later calls
    run the compiled code; the same numbers to float tolerance. Needs a C++ compiler on the CPU. Not with
    `async_rollouts`."""
    collective_timeout_minutes: int = 180
    """Several processes: how long a collective waits for the others. The main process judges each evaluation's
    samples and writes checkpoints and reports while the others wait in the next collective, which may take longer
    than torch's 10-minute NCCL default."""

    def validate(self):
        if self.collective_timeout_minutes < 1:
            raise ConfigError(
                f"runtime.collective_timeout_minutes: expected an integer >= 1, got {self.collective_timeout_minutes}"
            )
        if self.staleness < 0:
            raise ConfigError(
                f"runtime.staleness: expected an integer >= 0 (0: rollouts use the newest weights), got "
                f"{self.staleness}"
            )
        if self.compile and self.async_rollouts:
            raise ConfigError(
                "runtime.compile: not with runtime.async_rollouts (the rollout worker's copy of the policy shares "
                "the learner's modules); use one or the other"
            )
        if self.threads < 0:
            raise ConfigError(f"runtime.threads: expected an integer >= 0 (0: torch's default), got {self.threads}")


# The fields the `train` section held before it was split by concern: {field: its section now}. An old config that
# sets one is told where it went; a run folder's saved config of that layout is read in the new one (`upgraded`).
MOVED_FROM_TRAIN = {
    **dict.fromkeys(
        ("optimizer", "lr", "lr_schedule", "weight_decay", "adam_betas", "grad_clip", "ema_decay"), "optim"
    ),
    **dict.fromkeys(
        (
            "microbatch_size",
            "rollout_microbatch",
            "decode_microbatch",
            "reward_microbatch",
            "gradient_checkpointing",
            "offload_text_encoders",
            "embedding_cache",
            "mixed_precision",
            "weight_dtype",
        ),
        "memory",
    ),
    **dict.fromkeys(
        ("async_rewards", "async_rollouts", "staleness", "threads", "collective_timeout_minutes"), "runtime"
    ),
}
