"""Asynchronous online training: a rollout worker samples (and scores) upcoming updates' batches in a background
thread, on its own copy of the policy loaded with a snapshot of the trained weights, while the learner trains.

Schedule (deterministic, so a run is reproducible and resumes exactly): the batch of update u is sampled with the
weights after update v(u) = max(0, u - S), S = runtime.staleness. Batch u is submitted as soon as weights v(u) exist,
so while the learner trains update u the worker can already sample updates u + 1 .. u + S. With S = 0 every batch
waits for the newest weights: the same samples, rewards and updates as synchronous training, bit for bit (the worker's
copy holds the same weights and runs the same code). Algorithms see the learner's current policy in `prepare`
(GRPO's ratio is against the stored behaviour log-probs, so it corrects for the lag; NFT and DHO take their old
velocities from the current policy).

One process only (the worker's reward gathering would interleave with the learner's collectives). The worker's policy
is the learner's `sharing_copy`: under LoRA it shares every frozen weight (the denoiser's base weights, the VAE, the
text encoders), which the two threads only read in no-grad passes, and owns its adapter, so the worker costs one
adapter's memory, not a second model (a full fine-tune copies its trainable denoiser). Prompt encoding is serialised
by a lock the two share, since offloading text encoders moves them between devices.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from safetensors.torch import load_file, save_file

SNAPSHOTS_FILE = "rollout_snapshots.safetensors"  # in a checkpoint: the weight versions pending batches use


def read_snapshots(checkpoint: Path) -> dict[int, dict]:
    """The snapshots a checkpoint carries ({} for a synchronous one): version -> trainable weights."""
    path = Path(checkpoint) / SNAPSHOTS_FILE
    snapshots: dict[int, dict] = {}
    if path.is_file():
        for key, tensor in load_file(path).items():
            version, name = key.split("/", 1)
            snapshots.setdefault(int(version), {})[name] = tensor
    return snapshots


def snapshot_version(update: int, staleness: int) -> int:
    """The weights (as the number of updates trained) the batch of `update` is sampled with."""
    return max(0, update - staleness)


class RolloutWorker:
    def __init__(self, trainer):
        self.trainer, self.staleness = trainer, trainer.config.runtime.staleness
        self.policy = trainer.policy.sharing_copy()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowrl-rollouts")
        self.pending: dict[int, Future] = {}
        self.snapshots: dict[int, dict] = {}  # version -> trainable weights (CPU), the ones pending batches need

    def start(self, update: int, last: int, saved_snapshots: dict[int, dict] | None = None) -> None:
        """Queue the batches of updates `update` .. `update` + S before `last` (the trainer's weights are version
        `update`; a resumed run passes the snapshots of the versions before it, saved with its checkpoint)."""
        from flowrl.errors import UserError

        self.snapshots.update(saved_snapshots or {})
        self.snapshots[update] = self.current()
        queued = range(update, min(update + self.staleness + 1, last))
        missing = sorted({snapshot_version(u, self.staleness) for u in queued} - set(self.snapshots))
        if (
            missing
        ):  # e.g. a synchronous checkpoint resumed asynchronously, or a larger staleness than it was saved with
            raise UserError(
                f"runtime.staleness: resuming at update {update} with staleness {self.staleness} needs the "
                f"weights of updates {missing}, which the checkpoint does not hold; resume with the "
                "staleness it was saved with, or runtime.async_rollouts: false"
            )
        for u in queued:
            self.submit(u)

    def current(self) -> dict:
        return {k: v.cpu() for k, v in self.trainer.policy.trainable_state_dict().items()}  # already copies

    def submit(self, update: int) -> None:
        version = snapshot_version(update, self.staleness)
        if version not in self.snapshots:
            raise RuntimeError(f"rollout worker: no snapshot of version {version} for update {update}")
        self.pending[update] = self.pool.submit(self._collect, update, self.snapshots[version])

    def _collect(self, update: int, weights: dict):
        self.policy.load_trainable_state_dict(weights)
        return self.trainer.collect(update, policy=self.policy)

    def take(self, update: int):
        """(batch, metrics) of `update`, waiting for the worker if it is not done."""
        started = time.time()
        batch, metrics = self.pending.pop(update).result()
        metrics["rollout_wait_seconds"] = time.time() - started
        metrics["staleness"] = float(update - snapshot_version(update, self.staleness))
        return batch, metrics

    def trained(self, update: int, last: int) -> None:
        """The learner finished `update` (its weights are now version update + 1): queue the batch that waited for
        them, and drop snapshots no pending batch needs."""
        version = update + 1
        self.snapshots[version] = self.current()
        nxt = version + self.staleness
        if nxt < last:
            self.submit(nxt)
        needed = {snapshot_version(u, self.staleness) for u in range(version, version + self.staleness + 1)}
        for v in [v for v in self.snapshots if v not in needed]:
            del self.snapshots[v]

    def write_snapshots(self, folder: Path, current: int) -> None:
        """Into a checkpoint folder: the snapshots a run resumed at update `current` needs besides its current weights
        (versions u - S .. u - 1; the checkpoint holds version u itself)."""
        save_file(
            {
                f"{v}/{k}": t.contiguous()
                for v, state in self.snapshots.items()
                if v != current
                for k, t in state.items()
            },
            Path(folder) / SNAPSHOTS_FILE,
        )

    def close(self) -> None:
        for future in self.pending.values():
            future.cancel()
        self.pool.shutdown(wait=True)
        self.policy = None  # the copy's memory back before evaluation (the learner's policy is what evaluates)
