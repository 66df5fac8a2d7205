"""The trainer's config: resolution order, overrides, validation messages, presets, recipes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from entropace.algos import get_policy_loss
from entropace.train.algorithms import (
    PACED_LOSS_RECIPES,
    RECIPES,
    Recipe,
    effective_bounds,
    get_recipe,
    recipe_lever,
    register_recipe,
)
from entropace.train.config import (
    ConfigError,
    TrainConfig,
    load_config,
    load_config_file,
    parse_override,
    preset_names,
    save_config,
    to_dict,
)


def cfg(*overrides: str, preset: str | None = None) -> TrainConfig:
    return load_config(preset, list(overrides), check_envs=False)


# --------------------------------------------------------------------------- resolution order


def test_defaults_are_the_dataclass_defaults_plus_the_grpo_recipe() -> None:
    # grpo's recipe is the identity's defaults (token-mean, as verl and AgentRL run GRPO)
    assert to_dict(cfg()) == to_dict(TrainConfig())


def test_shortcuts_expand() -> None:
    c = cfg("algo=eppo", "tasks=db,kg", "lr=3e-5", "G=6", "P=3", "model=tiny")
    assert c.algorithm.name == "eppo" and c.algorithm.clip_rule == "pacer"
    assert c.tasks.names == ["db", "kg"]
    assert c.optim.lr == 3e-5
    assert (c.tasks.group_size, c.tasks.prompts_per_task) == (6, 3)
    assert c.model.name == "tiny"


def test_recipe_below_preset_below_cli(tmp_path) -> None:
    preset = tmp_path / "mine.yaml"
    preset.write_text("algorithm:\n  name: dapo\n  eps_high: 0.3\nsteps: 7\n")
    c = load_config(preset, [], check_envs=False)
    assert c.algorithm.eps_low == 0.2  # from the dapo recipe
    assert c.algorithm.eps_high == 0.3  # the preset beats the recipe's 0.28
    assert c.algorithm.dynamic_sampling and c.algorithm.overlong.enabled
    assert c.steps == 7
    c = load_config(preset, ["algorithm.eps_high=0.25", "algorithm.dynamic_sampling=false"],
                    check_envs=False)  # fmt: skip
    assert c.algorithm.eps_high == 0.25 and not c.algorithm.dynamic_sampling
    # the CLI can switch the algorithm of a preset: the new recipe replaces the preset's
    # settings of its own algorithm (dapo's bounds must not leak into GSPO's sequence clip),
    # the preset's other settings stay, and the CLI still wins over the new recipe
    c = load_config(preset, ["algo=gspo"], check_envs=False)
    assert c.algorithm.policy_loss == "gspo" and c.algorithm.eps_high is None
    assert effective_bounds(c.algorithm) == (3e-4, 4e-4)
    assert not c.algorithm.dynamic_sampling and not c.algorithm.overlong.enabled
    assert c.steps == 7
    c = load_config(preset, ["algo=gspo", "algorithm.eps_high=5e-4"], check_envs=False)
    assert effective_bounds(c.algorithm) == (3e-4, 5e-4)


#: The fixed bounds docs/training.md documents per recipe (None: not a fixed clip rule).
DOCUMENTED_BOUNDS = {
    "grpo": (0.2, 0.2), "dr_grpo": (0.2, 0.2), "dapo": (0.2, 0.28), "rloo": (0.2, 0.2),
    "gspo": (3e-4, 4e-4), "clip_cov": (0.2, 0.2), "dcpo": (0.16, 0.2), "ce_gppo": (0.2, 0.2),
    "papo": (0.2, 0.2), "kl_cov": None, "bapo": None, "eppo": None, "eppo+papo": None,
    "eppo-global": None, "eppo-notrend": None, "eppo-success": None, "eppo-rewardvar": None,
    "eppo-shuffled": None,
    # verl's trust regions, in each loss's own width units (BASELINES.md)
    "cispo": (10.0, 0.2), "gmpo": (0.4, 0.4), "sapo": (1.05, 1.0), "dppo_tv": (0.15, 0.15),
    "dppo_kl": (0.05, 0.05), "dro": (1.0, 1.0), "gpg": None,
    "reinforce_plus_plus": (0.2, 0.2), "reinforce_plus_plus_baseline": (0.2, 0.2),
    "opo": (0.2, 0.2), "grpo_passk": (0.2, 0.2),
    **{f"eppo+{n}": None for n in ("cispo", "gmpo", "sapo", "dppo_tv", "dppo_kl", "dro")},
}  # fmt: skip


@pytest.mark.parametrize("preset", [None, "quick", "paper", "lab", "paper-small"])
def test_every_recipe_under_every_preset_gets_its_documented_bounds(preset) -> None:
    assert set(DOCUMENTED_BOUNDS) == set(RECIPES)
    doc = Path(__file__).resolve().parents[1] / "docs" / "training.md"
    text = doc.read_text()
    for name, bounds in DOCUMENTED_BOUNDS.items():
        c = load_config(preset, [f"algo={name}"], check_envs=False).algorithm
        if bounds is None:  # pacer / BAPO / no width: the rule decides, not fixed bounds
            no_width = get_policy_loss(c.policy_loss).width is None
            assert c.clip_rule != "fixed" or no_width, name
            if c.clip_rule != "pacer" or get_policy_loss(c.policy_loss).width.native:
                assert (c.eps_low, c.eps_high) == (None, None), name
            continue
        assert c.clip_rule == "fixed", name
        assert effective_bounds(c) == pytest.approx(bounds), name
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        assert f"{_fmt(bounds[0])}/{_fmt(bounds[1])}" in row, (name, row)


def _fmt(x: float) -> str:
    return f"{x:g}" if x >= 1e-3 else f"{x:.0e}".replace("e-0", "e-")


def test_later_overrides_win_and_values_parse_as_yaml() -> None:
    c = cfg("steps=3", "steps=5", "algorithm.loss_options={dual_clip: 10}", "ppo.shuffle=false")
    assert c.steps == 5
    assert c.algorithm.loss_options == {"dual_clip": 10}
    assert c.ppo.shuffle is False
    c = cfg("optim.betas=[0.9, 0.95]", "algorithm.pacer.eps_high0=0.28", "rollout.max_turns=null")
    assert c.optim.betas == [0.9, 0.95]
    assert c.algorithm.pacer.eps_high0 == 0.28
    assert c.rollout.max_turns is None


def test_scientific_notation_without_dot_is_a_number(tmp_path) -> None:
    # YAML 1.1 reads 1e-6 as the string "1e-6"; float fields accept it
    path = tmp_path / "p.yaml"
    path.write_text("optim:\n  lr: 1e-6\n")
    assert load_config(path, [], check_envs=False).optim.lr == 1e-6


# --------------------------------------------------------------------------- error messages


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        ("algorithm.eps_hihg=0.3", ["algorithm.eps_hihg", "did you mean 'eps_high'", "eps_low"]),
        ("optimm.lr=0.1", ["optimm", "did you mean 'optim'"]),
        ("algo=eppo2", ["algorithm.name", "'eppo2'", "eppo+papo", "eppo-global"]),
        ("algorithm.agg=mean", ["algorithm.agg", "token-mean", "seq-mean-token-sum-norm"]),
        ("algorithm.clip_rule=adaptive", ["algorithm.clip_rule", "pacer", "bapo", "fixed"]),
        ("algorithm.policy_loss=ppo2", ["algorithm.policy_loss", "did you mean 'ppo'", "gspo"]),
        ("algorithm.advantage=gae", ["algorithm.advantage", "rloo", "dr_grpo"]),
        ("tasks.difficulty=extreme", ["tasks.difficulty", "'extreme'", "easy", "hard"]),
        ("optim.schedule=step", ["optim.schedule", "cosine"]),
        ("optim.lr=abc", ["optim.lr", "expected a number", "'abc'"]),
        ("optim.lr=-1", ["optim.lr", "> 0"]),
        ("ppo.epochs=0", ["ppo.epochs", "an integer in [1, 1000]"]),
        ("ppo.epochs=1.5", ["ppo.epochs", "expected an integer"]),
        ("ppo.shuffle=maybe", ["ppo.shuffle", "true/false"]),
        ("algorithm.pacer.eps_min=0.25", ["algorithm.pacer", "eps_min <= eps0"]),
        ("algorithm.pacer.signal=loss", ["algorithm.pacer.signal", "reward_var"]),
        ("algorithm.polarity.lam=2", ["algorithm.polarity", "lam"]),
        ("algorithm.bapo.c_lo=0.5", ["algorithm.bapo.c_lo", "c_low0"]),
        ("rollout.temperature=0", ["rollout", "temperature"]),
        ("rollout.max_new_tokens=5", ["rollout.max_new_tokens", "max_new_tokens_per_turn"]),
        ("tasks.mix={shop: 1}", ["tasks.mix", "'shop'", "reasoning"]),
        ("tasks.names=[]", ["tasks.names", "at least one"]),
        ("tasks.names=[db, db]", ["tasks.names", "duplicates"]),
        ("algorithm.eps_low=1.0", ["algorithm.eps_low", "must be < 1"]),
        ("algorithm.overlong={enabled: true, max_len: 10, cache_len: 20}",
         ["algorithm.overlong.cache_len"]),
        ("noequals", ["key.sub=value", "algo"]),
    ],
)  # fmt: skip
def test_bad_keys_and_values_name_the_key_and_the_allowed(override, fragments) -> None:
    with pytest.raises(ConfigError) as info:
        cfg("tasks=db,kg,reasoning", override)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_a_preset_name_is_not_shadowed_by_a_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quick").mkdir()  # e.g. a run directory called quick
    assert load_config("quick", [], check_envs=False).model.name == "smollm2-135m"


def test_unknown_preset_lists_the_presets() -> None:
    with pytest.raises(ConfigError) as info:
        load_config("quik", [])
    assert "did you mean 'quick'" in str(info.value) and "paper" in str(info.value)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent/x.yaml", [])


def test_unknown_task_lists_the_registered_environments() -> None:
    from entropace.envs import specs

    with pytest.raises(ConfigError) as info:
        load_config(None, ["tasks=db,nosuchtask"])
    assert "nosuchtask" in str(info.value)
    for name in specs():
        assert repr(name) in str(info.value)


def test_parse_override_nests_dotted_keys() -> None:
    assert parse_override("a.b.c=1") == {"a": {"b": {"c": 1}}}
    assert parse_override("tasks=db, kg") == {"tasks": {"names": ["db", "kg"]}}
    assert parse_override("model.name=org/model-1.5B") == {"model": {"name": "org/model-1.5B"}}


# --------------------------------------------------------------------------- files and presets


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_saved_config_reloads_identically_for_every_recipe(tmp_path, name) -> None:
    original = cfg(f"algo={name}", "steps=3", "algorithm.pacer.alpha=0.3")
    path = save_config(original, tmp_path / "config.yaml")
    assert to_dict(load_config_file(path, check_envs=False)) == to_dict(original)
    # overrides on top of a saved file (as --resume does)
    assert load_config_file(path, ["steps=9"], check_envs=False).steps == 9


def test_shipped_presets() -> None:
    assert {"quick", "paper"} <= set(preset_names())
    quick = load_config("quick", [])  # quick's tasks must exist in this install
    paper = cfg(preset="paper")
    for c in (quick, paper):
        # several optimiser steps per rollout batch, or the clip rules never act
        assert c.ppo.epochs * c.ppo.num_minibatches > 1
    assert quick.model.name == "smollm2-135m" and quick.model.device == "cpu"
    # the main job: two agent families, a warm start from their oracles, held-out success
    # at step 0 and at the end
    assert set(quick.tasks.names) == {"db", "kg"}
    assert quick.warm_start.source == "oracle" and quick.warm_start.lora
    assert quick.eval.every == quick.steps
    assert quick.tasks.difficulty == "easy"
    assert paper.tasks.group_size == 8 and paper.rollout.temperature == 0.8
    # AgentBench FC's 0 at abnormal ends, with its profile (docs/envs/agentbench.md)
    assert paper.rollout.abnormal_penalty == 0.0
    assert (paper.tasks.profile, paper.tasks.interface) == ("agentbench", "tools")
    assert paper.algorithm.name == "eppo" and paper.algorithm.pacer.eps0 == 0.2
    assert set(paper.tasks.names) == {"db", "kg", "os", "household", "shop"}
    assert paper.optim.lr == 1e-6


def test_every_shipped_preset_validates_with_its_environments() -> None:
    assert {"quick", "paper", "lab", "paper-small"} <= set(preset_names())
    for name in preset_names():
        c = load_config(name, [], check_envs=name != "paper")  # paper's os needs bwrap
        assert c.steps > 0 and c.tasks.names
    small = load_config("paper-small", [])
    assert small.model.name == "smollm2-135m" and small.model.device == "cuda"
    assert 3 <= len(small.tasks.names) <= 5 and 100 <= small.steps <= 1000
    assert small.algorithm.name == "eppo" and small.tasks.group_size == 8
    assert load_config("paper-small", ["algo=grpo"]).algorithm.clip_rule == "fixed"
    lab = load_config("lab", [])
    assert lab.model.name == "tiny" and lab.steps >= 200 and lab.algorithm.name == "grpo"
    assert lab.tasks.names == ["lab-easy", "lab-mid", "lab-hard"]


# --------------------------------------------------------------------------- recipes


EXPECTED = {  # BASELINES.md / ALGORITHMS.md, field by field
    "grpo": {"advantage": "grpo", "policy_loss": "ppo", "agg": "token-mean"},
    "dr_grpo": {"advantage": "dr_grpo", "agg": "seq-mean-token-sum-norm"},
    "dapo": {"eps_low": 0.2, "eps_high": 0.28, "agg": "token-mean", "dynamic_sampling": True},
    "rloo": {"advantage": "rloo", "agg": "token-mean"},
    "gspo": {"policy_loss": "gspo", "bounds": (3e-4, 4e-4)},
    "clip_cov": {"policy_loss": "clip_cov"},
    "kl_cov": {"policy_loss": "kl_cov"},
    "dcpo": {"policy_loss": "dcpo", "bounds": (0.16, 0.2)},
    "bapo": {"clip_rule": "bapo", "policy_loss": "ppo"},
    "ce_gppo": {"policy_loss": "ce_gppo"},
    "eppo": {"clip_rule": "pacer", "papo": False},
    "papo": {"clip_rule": "fixed", "papo": True},
    "eppo+papo": {"clip_rule": "pacer", "papo": True},
    "eppo-global": {"clip_rule": "pacer", "pacer.task_wise": False, "pacer.trend": True},
    "eppo-notrend": {"clip_rule": "pacer", "pacer.trend": False, "pacer.task_wise": True},
    "eppo-success": {"clip_rule": "pacer", "pacer.signal": "success"},
    "eppo-rewardvar": {"clip_rule": "pacer", "pacer.signal": "reward_var"},
    "eppo-shuffled": {"clip_rule": "pacer", "pacer.shuffle": True, "pacer.signal": "entropy"},
    "cispo": {"policy_loss": "cispo", "agg": "token-mean", "eps_low": 10.0, "eps_high": 0.2},
    "gmpo": {"policy_loss": "gmpo", "agg": "seq-mean-token-mean", "eps_low": 0.4},
    "sapo": {"policy_loss": "sapo", "agg": "seq-mean-token-mean", "loss_options": {}},
    "dppo_tv": {
        "policy_loss": "dppo_tv",
        "advantage": "dr_grpo",
        "eps_low": 0.15,
        "agg": "seq-mean-token-sum-norm",
        "loss_options": {"ratio_cap": None},
    },
    "dppo_kl": {"policy_loss": "dppo_kl", "advantage": "dr_grpo", "eps_high": 0.05},
    "dro": {"policy_loss": "dro", "advantage": "dr_grpo", "eps_low": None},
    "gpg": {"policy_loss": "gpg", "advantage": "gpg"},
    "reinforce_plus_plus": {"advantage": "reinforce_plus_plus", "policy_loss": "ppo"},
    "reinforce_plus_plus_baseline": {"advantage": "reinforce_plus_plus_baseline"},
    "opo": {"advantage": "opo"},
    "grpo_passk": {"advantage": "grpo_passk", "agg": "seq-mean-token-mean"},
    "eppo+cispo": {"clip_rule": "pacer", "policy_loss": "cispo", "eps_low": 10.0},
    "eppo+gmpo": {"clip_rule": "pacer", "policy_loss": "gmpo", "eps_high": 0.4},
    "eppo+sapo": {"clip_rule": "pacer", "policy_loss": "sapo"},
    "eppo+dppo_tv": {"clip_rule": "pacer", "policy_loss": "dppo_tv", "advantage": "dr_grpo"},
    "eppo+dppo_kl": {"clip_rule": "pacer", "policy_loss": "dppo_kl", "eps_low": 0.05},
    "eppo+dro": {"clip_rule": "pacer", "policy_loss": "dro", "papo": False},
}


def test_every_required_algorithm_is_registered_with_its_defaults() -> None:
    assert set(EXPECTED) <= set(RECIPES)
    for name, fields in EXPECTED.items():
        a = cfg(f"algo={name}").algorithm
        for key, value in fields.items():
            if key == "bounds":  # the loss's own defaults (eps_low / eps_high left unset)
                assert effective_bounds(a) == value and a.eps_low is None, name
                continue
            obj = a
            for part in key.split("."):
                obj = getattr(obj, part)
            assert obj == value, (name, key, obj)
        assert a.kl_beta == 0.0  # recipes differ only in the rule they are about


def test_widths_and_the_pacer_are_checked_when_the_config_loads() -> None:
    # EPPO composes with every loss that has a trust-region width; GPG and KL-Cov have none
    for loss in ("gpg", "kl_cov"):
        with pytest.raises(ConfigError, match=rf"clip_rule=pacer: policy loss '{loss}' has no "
                                              r"trust-region width.*'cispo'"):  # fmt: skip
            cfg("algo=eppo", f"algorithm.policy_loss={loss}")
    # a width not native to the pacer starts at the loss's own widths
    a = cfg("algo=eppo", "algorithm.policy_loss=gmpo", "algorithm.eps_low=0.3").algorithm
    assert effective_bounds(a) == (0.3, 0.2)
    # ... PPO's starts at the pacer's eps0, as before
    with pytest.raises(ConfigError, match="under algorithm.clip_rule=pacer"):
        cfg("algo=eppo", "algorithm.eps_low=0.3")
    # widths held in options refuse eps_*
    with pytest.raises(ConfigError, match="algorithm.eps_low: the widths of policy loss 'sapo' "
                                          "are its gate temperatures"):  # fmt: skip
        cfg("algo=sapo", "algorithm.eps_low=1.5")
    c = cfg("algo=sapo", "algorithm.loss_options={tau_neg: 2, tau_pos: 0.5}").algorithm
    assert effective_bounds(c) == (2.0, 0.5)
    assert effective_bounds(cfg("algo=dro", "algorithm.loss_options={beta: 0.3}").algorithm) == (
        0.3, 0.3)  # fmt: skip
    # a ratio bound needs eps_low < 1; CISPO's weight bound and GMPO's log bound do not
    with pytest.raises(ConfigError, match="eps_low must be < 1"):
        cfg("algo=grpo", "algorithm.eps_low=1.5")
    assert cfg("algo=cispo").algorithm.eps_low == 10.0
    assert cfg("algo=gmpo", "algorithm.eps_low=1.5").algorithm.eps_low == 1.5
    # BAPO searches PPO's ratio bounds only
    with pytest.raises(ConfigError, match="clip_rule=bapo searches PPO's ratio bounds"):
        cfg("algo=bapo", "algorithm.policy_loss=gmpo")
    # an estimator's options are its own, validated
    c = cfg("algorithm.advantage=reinforce_plus_plus", "algorithm.advantage_options={gamma: 0.9}")
    assert c.algorithm.advantage_options == {"gamma": 0.9}
    with pytest.raises(ConfigError, match="algorithm.advantage_options: gamma must be"):
        cfg("algorithm.advantage=reinforce_plus_plus", "algorithm.advantage_options={gamma: 2}")
    with pytest.raises(ConfigError, match="'algorithm.advantage_options.gamma'"):
        cfg("algorithm.advantage_options={gamma: 0.9}")  # grpo's option is eps
    # the trainer does not generate ReMax's greedy baselines
    with pytest.raises(ConfigError, match="advantage='remax' needs \\['baselines'\\].*greedy"):
        cfg("algorithm.advantage=remax")


#: Issue 35: every EPPO / PAPO recipe and every control is its base recipe plus exactly the
#: change it names (``{dotted field: value}``), derived here from the resolved configs.
VARIANTS = {
    "eppo": ("grpo", {"clip_rule": "pacer"}),
    "papo": ("grpo", {"papo": True}),
    "eppo+papo": ("eppo", {"papo": True}),
    "eppo-global": ("eppo", {"pacer.task_wise": False}),
    "eppo-notrend": ("eppo", {"pacer.trend": False}),
    "eppo-success": ("eppo", {"pacer.signal": "success"}),
    "eppo-shuffled": ("eppo", {"pacer.shuffle": True}),
    "eppo-rewardvar": ("eppo", {"pacer.signal": "reward_var"}),
    **{f"eppo+{n}": (n, {"clip_rule": "pacer"}) for n in PACED_LOSS_RECIPES},
}


def _resolved(name: str) -> dict:
    """Recipe ``name`` resolved through the trainer's config loader, flattened."""
    def flat(d: dict, prefix: str = "") -> dict:
        out: dict = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {prefix + k: v})
        return out

    return flat(to_dict(cfg(f"algo={name}"))["algorithm"])


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_variant_is_its_base_plus_exactly_its_lever(name) -> None:
    """The difference of each variant's resolved config from its base's is the declared lever
    (brute force over every field, through load_config); every registered recipe with an
    entropace-specific rule (pacer, PAPO) is a declared variant, so a recipe added later
    cannot enter the comparisons with a second, undeclared change."""
    recipe = get_recipe(name)
    a = cfg(f"algo={name}").algorithm
    if a.clip_rule == "pacer" or a.papo:
        assert name in VARIANTS, f"{name} uses the pacer / PAPO but declares no base"
    if name not in VARIANTS:
        assert recipe.base is None
        return
    base, lever = VARIANTS[name]
    assert recipe.base == base
    mine, theirs = _resolved(name), _resolved(base)
    diff = {k: mine[k] for k in mine if k != "name" and mine[k] != theirs.get(k)}
    assert diff == lever
    assert recipe_lever(name) == {k: (theirs[k], v) for k, v in lever.items()}


def test_a_variant_must_change_exactly_what_it_names() -> None:
    with pytest.raises(ConfigError, match="recipe 'noop'.*changes \\[\\]"):
        register_recipe(Recipe("noop", "x", "y", {"agg": "token-mean"}, base="grpo"))
    with pytest.raises(ConfigError, match="recipe 'self'.*its own base"):
        register_recipe(Recipe("self", "x", "y", {"papo": True}, base="self"))
    with pytest.raises(ConfigError, match="recipe 'orphan'.*unknown algorithm 'nope'"):
        register_recipe(Recipe("orphan", "x", "y", {"papo": True}, base="nope"))
    assert not {"noop", "self", "orphan"} & set(RECIPES)
    mine = register_recipe(Recipe("eppo-wide", "x", "y", {"pacer": {"alpha": 0.9}}, base="eppo"))
    try:
        assert recipe_lever("eppo-wide") == {"pacer.alpha": (0.4, 0.9)}
        assert recipe_lever("eppo-wide", "grpo") == {
            "clip_rule": ("fixed", "pacer"), "pacer.alpha": (0.4, 0.9)}  # fmt: skip
        assert mine.identity()["clip_rule"] == "pacer"
    finally:
        del RECIPES["eppo-wide"]


def test_register_recipe_checks_its_overrides() -> None:
    with pytest.raises(ConfigError, match="recipe 'bad'.*eps_hi"):
        register_recipe(Recipe("bad", "x", "y", {"eps_hi": 0.3}))
    assert "bad" not in RECIPES
    custom = register_recipe(Recipe("my-dapo", "x", "y", {"eps_high": 0.35}))
    try:
        assert get_recipe("my-dapo") is custom
        assert cfg("algo=my-dapo").algorithm.eps_high == 0.35
    finally:
        del RECIPES["my-dapo"]


def test_saved_config_is_every_dataclass_field_and_round_trips(tmp_path) -> None:
    # one source of truth: the saved YAML has exactly the dataclass fields, and loads back equal
    import yaml

    from entropace.train.config import save_config

    c = cfg("algo=dapo", "algorithm.loss_options={dual_clip: 4}", preset="quick")
    path = save_config(c, tmp_path / "config.yaml")

    def keys(obj, data, prefix=""):
        fields = {f.name: f for f in dataclasses.fields(obj)}
        assert set(data) == set(fields), prefix
        for name, value in data.items():
            if dataclasses.is_dataclass(getattr(obj, name)):
                keys(getattr(obj, name), value, f"{prefix}{name}.")

    keys(c, yaml.safe_load(path.read_text()))
    back = load_config_file(path, check_envs=False)
    assert to_dict(back) == to_dict(c) and isinstance(back, TrainConfig)
    assert back.algorithm.loss_options == {"dual_clip": 4}


def test_unknown_preset_error_reads_well() -> None:
    with pytest.raises(ConfigError) as err:
        cfg(preset="quik")
    msg = str(err.value)
    assert msg.startswith("unknown preset 'quik' (did you mean 'quick'?); presets: [")
    assert "allowed keys" not in msg and "'paper'" in msg and msg.endswith("a .yaml file)")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ("algorithm.loss_options={beta1: 0.5}", r"unknown config key 'algorithm.loss_options.beta1'.*dual_clip"),
        ("algorithm.loss_options={dual_clip: 0.5}", r"algorithm.loss_options: dual_clip must be a number in \(1, 4.85e\+08\]"),
        ("algorithm.loss_options={dual_clip: high}", r"algorithm.loss_options.dual_clip: expected a number, got .high."),
    ],
)  # fmt: skip
def test_loss_options_are_validated_when_the_config_loads(options, match) -> None:
    with pytest.raises(ConfigError, match=match):
        cfg(options)
    c = cfg("algo=clip_cov", "algorithm.loss_options={clip_ratio: 0.01}")
    assert c.algorithm.loss_options == {"clip_ratio": 0.01}
    with pytest.raises(ConfigError, match="cov_lower <= cov_upper"):
        cfg("algo=clip_cov", "algorithm.loss_options={cov_lower: 9}")


def test_a_preset_options_for_deselected_tasks_do_not_apply(tmp_path) -> None:
    # a preset with options for reasoning; choosing other tasks must not trip over them
    preset = tmp_path / "p.yaml"
    preset.write_text("tasks:\n  names: [db, kg, reasoning]\n"
                      "  options: {reasoning: {datasets: basic_arithmetic}}\n")  # fmt: skip
    assert cfg("tasks=db,kg", preset=str(preset)).tasks.options == {}
    kept = cfg("tasks=db,reasoning", preset=str(preset)).tasks.options
    assert kept == {"reasoning": {"datasets": "basic_arithmetic"}}
    with pytest.raises(ConfigError, match="tasks.options: 'kg' is not allowed"):
        cfg("tasks=db", "tasks.options={kg: {}}", preset=str(preset))


def test_a_preset_mix_for_deselected_tasks_does_not_apply(tmp_path: Path) -> None:
    preset = tmp_path / "p.yaml"
    preset.write_text("tasks: {names: [db, kg], mix: {kg: 3, db: 0.5}}\n")
    assert load_config(preset, ["tasks=db,reasoning"]).tasks.mix == {"db": 0.5}
    assert load_config(preset, []).tasks.mix == {"kg": 3, "db": 0.5}
    with pytest.raises(ConfigError, match="tasks.mix: 'kg' is not allowed"):
        load_config(preset, ["tasks=db", "tasks.mix={kg: 2}"])
