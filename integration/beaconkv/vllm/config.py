"""The one BeaconKV-in-vLLM config: policy, budget and knobs, from ``BEACONKV_VLLM_CONFIG``.

``BEACONKV_VLLM_CONFIG`` holds JSON such as
``{"policy": "beacon", "budget": 158, "knobs": ["interval=16"], "block_size": 8}``
(``knobs`` may also be a ``{"name": value}`` map; the policy ``"model"`` runs the policy the
served model's directory recommends, its config.json's ``beaconkv_policy``, with the knobs
on top (``"model": DIR`` reads another directory); ``"admission": "optimistic"`` turns off
the peak reservation, see docs/vllm.md; ``"scorer": "paged"`` chooses each step's keep-sets
through the GPU pipeline's CPU twin, every planned head in one call, docs/gpu.md). The core's policy registry builds the
policy object (``beaconkv.make_policy_config``), so unknown policies and knobs fail exactly as
they do in ``beaconkv eval``, here at engine start.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

ENV = "BEACONKV_VLLM_CONFIG"
_KEYS = {"policy", "budget", "knobs", "block_size", "admission", "scorer", "model"}
ADMISSION = ("reserve", "optimistic")
SCORERS = ("host", "paged")


@dataclass
class VllmConfig:
    policy: str = "full"
    budget: int | None = None
    knobs: dict | list = field(default_factory=dict)  # {name: value} or ["NAME=VALUE", ...]
    # Tokens per block of our pool (one (sequence, layer, kv_head)). 8: a head cycling
    # through budget..budget + interval tokens is rounded up less than with 16, so more
    # requests fit, at no measured per-step cost (docs/vllm.md, 2026-12-04).
    block_size: int = 8
    # reserve: admit a request only when the pool's demand fits at every coming step with it
    # (each head along its policy's cycle; no preemption for bounded policies); optimistic:
    # vLLM's rule (room for the prompt now), preempting when the pool runs out.
    admission: str = "reserve"
    # host: each sequence's policy scores its heads (on threads); paged: the policies plan and
    # one scorer call (the device pipeline's CPU twin) scores every planned head of the step.
    scorer: str = "host"
    # The model directory whose recommended policy the name "model" stands for; the scheduler
    # fills in the served model's when it is not given.
    model: str | None = None

    def names_model_policy(self) -> bool:
        import beaconkv

        return beaconkv.names_model_policy(self.policy)

    def policy_config(self):
        """The native policy config; ValueError naming the bad policy or knob (or, for the
        policy "model", a model directory that recommends none)."""
        import beaconkv

        return beaconkv.make_policy_config(self.policy, self.budget, knobs=self.knobs,
                                           model=self.model)

    def to_json(self) -> str:
        return json.dumps({"policy": self.policy, "budget": self.budget, "knobs": self.knobs,
                           "block_size": self.block_size, "admission": self.admission,
                           "scorer": self.scorer, "model": self.model})


def parse(text: str) -> VllmConfig:
    """A config from JSON text; ValueError on anything it does not understand."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{ENV} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{ENV} must be a JSON object, got {type(data).__name__}")
    unknown = set(data) - _KEYS
    if unknown:
        raise ValueError(f"{ENV}: unknown key(s) {sorted(unknown)}; expected {sorted(_KEYS)}")
    knobs = data.get("knobs") or {}
    if not isinstance(knobs, (list, dict)):
        raise ValueError(f"{ENV}: 'knobs' must be a list of NAME=VALUE or a map")
    admission = data.get("admission", "reserve")
    if admission not in ADMISSION:
        raise ValueError(f"{ENV}: admission must be one of {list(ADMISSION)}, got {admission!r}")
    scorer = data.get("scorer", "host")
    if scorer not in SCORERS:
        raise ValueError(f"{ENV}: scorer must be one of {list(SCORERS)}, got {scorer!r}")
    model = data.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise ValueError(f"{ENV}: 'model' must be a model directory, got {model!r}")
    cfg = VllmConfig(policy=str(data.get("policy", "full")), budget=data.get("budget"),
                     knobs=knobs, block_size=int(data.get("block_size", VllmConfig.block_size)),
                     admission=admission, scorer=scorer, model=model)
    # Fail now, at engine start, on an unknown policy or knob; "model" without a directory
    # waits for the scheduler, which knows the served model.
    if cfg.model is not None or not cfg.names_model_policy():
        cfg.policy_config()
    return cfg


def from_env() -> VllmConfig | None:
    """The config in the environment, or None when BeaconKV is not enabled."""
    text = os.environ.get(ENV)
    return None if text is None else parse(text)


def enabled() -> bool:
    return ENV in os.environ


def check_geometry(hf_config, dtype) -> tuple[int, int, int, int]:
    """(num_layers, num_kv_heads, num_heads, head_dim) of a model our pool supports; ValueError
    with the reason otherwise (the model is never run on the stock cache instead)."""
    import torch

    archs = getattr(hf_config, "architectures", None) or []
    reasons = []
    if dtype != torch.float32:
        reasons.append(f"dtype {dtype} (the CPU pool stores float32; pass --dtype float32)")
    layers = getattr(hf_config, "num_hidden_layers", None)
    heads = getattr(hf_config, "num_attention_heads", None)
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    head_dim = getattr(hf_config, "head_dim", None) or (
        hf_config.hidden_size // heads if heads else None)
    if not layers or not heads or not head_dim:
        reasons.append("the config does not name num_hidden_layers/num_attention_heads/head_dim")
    elif heads % kv_heads:
        reasons.append(f"{heads} query heads are not a multiple of {kv_heads} kv heads")
    if getattr(hf_config, "sliding_window", None):
        reasons.append("sliding-window attention")
    if getattr(hf_config, "layer_types", None) and any(
            t != "full_attention" for t in hf_config.layer_types):
        reasons.append(f"layer types {sorted(set(hf_config.layer_types))}")
    if archs and not any(a in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                               "MistralForCausalLM") for a in archs):
        reasons.append(f"architecture {archs} (a Llama-style decoder is required)")
    try:
        rope_theta(hf_config)
    except ValueError as e:
        reasons.append(str(e))
    if reasons:
        raise ValueError("BeaconKV cannot serve this model: " + "; ".join(reasons))
    return int(layers), int(kv_heads), int(heads), int(head_dim)


def rope_theta(hf_config) -> float:
    """RoPE base of a model with plain (unscaled) RoPE; ValueError otherwise (the policies
    rotate beacons and recover pre-RoPE queries with plain RoPE)."""
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling",
                                                                   None) or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", None):
        raise ValueError(f"RoPE type {kind!r} (only plain RoPE)")
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None))
    if theta is None:
        raise ValueError("the config has no rope_theta")
    return float(theta)
