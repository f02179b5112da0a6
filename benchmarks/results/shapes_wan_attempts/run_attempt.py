"""Stage 1 once per VAE setting (saved under /tmp/wan), then the flow stage of a size variant on it, save + card."""

import copy
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from flowrl.models.shapes_wan import ShapesWanSize, build_pipeline
from flowrl.pretrain.shapes_sd3 import save_pipeline
from flowrl.pretrain.shapes_wan import WanPretrainConfig, evaluate_and_write_card, train_video_flow, train_video_vae

name, tp, patch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
cfg_extra = {k: v for k, v in extra.items() if k in WanPretrainConfig.__dataclass_fields__}
size_extra = {k: v for k, v in extra.items() if k in ShapesWanSize.__dataclass_fields__}
cfg = WanPretrainConfig(**cfg_extra)
size = ShapesWanSize(temporal_patch=tp, patch=patch, **size_extra)
torch.set_num_threads(2)
torch.manual_seed(cfg.seed)
pipe = build_pipeline(size, seed=cfg.seed)
vae_keys = {k: v for k, v in sorted(cfg_extra.items()) if k.startswith("vae_")}  # a stage-1 VAE per VAE setting
vae_path = Path("/tmp/wan/" + ("_".join(f"{k}{v}" for k, v in vae_keys.items()) if vae_keys else "vae_stage1") + ".pt")
facts = {"config": asdict(cfg), "size": asdict(size)}
if vae_path.exists():
    saved = torch.load(vae_path)
    pipe.vae.load_state_dict(saved["state"])
    pipe.vae.register_to_config(**saved["config_updates"])
    facts.update(saved["facts"])
else:
    before = dict(pipe.vae.config)
    t0 = time.time()
    vf = train_video_vae(pipe.vae, cfg, np.random.default_rng(cfg.seed))
    vf["vae_minutes"] = (time.time() - t0) / 60
    updates = {k: v for k, v in pipe.vae.config.items() if before.get(k) != v}
    torch.save({"state": pipe.vae.state_dict(), "facts": vf, "config_updates": updates}, vae_path)
    facts.update(vf)
print("vae facts", {k: v for k, v in facts.items() if k.startswith("vae")}, flush=True)
t0 = time.time()
facts.update(
    train_video_flow(pipe, cfg, np.random.default_rng(cfg.seed + 1), torch.Generator().manual_seed(cfg.seed + 1))
)
facts["flow_minutes"] = (time.time() - t0) / 60
facts["total_minutes"] = facts["flow_minutes"] + facts["vae_minutes"]
print("flow minutes", facts["flow_minutes"], flush=True)
pipe.to(torch.float16)
out = Path("/tmp/wan") / name
save_pipeline(copy.deepcopy(pipe), out, facts)
print(json.dumps(evaluate_and_write_card(out), indent=1))
