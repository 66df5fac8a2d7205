"""The verl example composes with verl 0.9.1's own config and drives the entropace trainer.

Hydra composes ``examples/verl/config/entropace_multitask.yaml`` on top of verl's
``ppo_trainer`` (as ``main_ppo --config-path examples/verl/config`` does); the composed config
selects the registered trainer and loss, and the entropace section resolves to EPPO + PAPO
settings. ``make_data.py`` writes rows the agent loop accepts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install 'entropace[verl]')")

from hydra import compose, initialize_config_dir  # noqa: E402

from entropace.integrations.verl.agent_loop import episode_spec  # noqa: E402
from entropace.integrations.verl.hooks import settings_from_config  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "verl"


def test_example_config_composes_on_verl_ppo_trainer() -> None:
    with initialize_config_dir(config_dir=str(EXAMPLE / "config"), version_base=None):
        cfg = compose(config_name="entropace_multitask")
    assert cfg.trainer.use_v1 and cfg.trainer.v1.trainer_mode == "entropace"
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "eppo_papo"
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "entropace"
    assert cfg.actor_rollout_ref.model.use_remove_padding is True
    # verl's defaults are still there (the example overrides, it does not replace)
    assert cfg.actor_rollout_ref.actor.clip_ratio_c == 3.0
    assert "optim" in cfg.actor_rollout_ref.actor
    s = settings_from_config(cfg)
    assert s.recipe == "eppo+papo" and s.clip_rule == "pacer" and s.papo
    assert s.clip.pacer.alpha == 0.4 and s.polarity.lam == 0.5


def test_make_data_writes_agent_loop_rows(tmp_path: Path) -> None:
    import runpy

    import pandas as pd

    mod = runpy.run_path(str(EXAMPLE / "make_data.py"))
    mod["main"](["--out", str(tmp_path), "--families", "db,kg", "--train", "2", "--val", "1"])
    train = pd.read_parquet(tmp_path / "train.parquet")
    val = pd.read_parquet(tmp_path / "val.parquet")
    assert list(train["data_source"]) == ["db", "db", "kg", "kg"] and len(val) == 2
    row = train.iloc[2].to_dict()
    spec = episode_spec(row)
    assert spec["env"] == "kg" and spec["seed"] == 0
    assert set(train["agent_name"]) == {"entropace"}
    assert int(val.iloc[0]["extra_info"]["entropace"]["seed"]) == 1_000_000


def test_trainer_builds_from_the_example_config_as_verls_sync_trainer() -> None:
    """verl's own PPOTrainer.__init__ on the composed config (no Ray cluster is started)."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import Role
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    from entropace.integrations.verl import trainer as vt

    with initialize_config_dir(config_dir=str(EXAMPLE / "config"), version_base=None):
        cfg = compose(config_name="entropace_multitask")
    OmegaConf.resolve(cfg)
    t = vt.EntropacePPOTrainer(cfg)
    assert type(t.replay_buffer) is ReplayBuffer and t.trainer_mode == "sync"
    assert t.entropace.settings.recipe == "eppo+papo" and t.entropace.needs_sensitivity
    t._init_resource_pool_mgr()
    actor = t.role_worker_mapping[Role.ActorRollout]
    assert actor.__ray_metadata__.class_name == "EntropaceActorRolloutRefWorker"
