#!/usr/bin/env bash
# EPPO + PAPO on verl 0.9.1: Qwen2.5-7B-Instruct, five entropace families at once, GRPO
# advantages, G = 8, one node of 8 GPUs (H100/H200 80 GB+). Needs verl's GPU stack (vLLM,
# flash-attn), which this repository's CI does not install: see docs/integrations/verl.md.
#
#   pip install -c constraints.txt "entropace[all,verl]" "verl[vllm]==0.9.1"
#   python examples/verl/make_data.py --out data/entropace
#   bash examples/verl/run_eppo_papo_7b.sh [hydra overrides...]
#
# Any verl or entropace option can be overridden on the command line, e.g.
#   actor_rollout_ref.actor.policy_loss.loss_mode=eppo entropace.algorithm=eppo-notrend
#   entropace.options.pacer.alpha=0.5 actor_rollout_ref.model.path=/path/to/model
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

python -c "import verl; from entropace.integrations.verl import plugin; \
assert 'trainer' in plugin.REGISTERED, plugin.FAILED; print('entropace verl plug-in:', plugin.REGISTERED)"

exec python -m verl.trainer.main_ppo \
  --config-path "$here/config" \
  --config-name entropace_multitask \
  "$@"
