"""Which checkpoint tensors travel together (no engine; the real model's
groups are checked in test_update_promise.py)."""

from __future__ import annotations

from rollout_service.worker.param_groups import group, module_of

MODULES = {
    "",
    "model",
    "model.layers.0",
    "model.layers.0.self_attn",
    "model.layers.0.self_attn.qkv_proj",
    "model.layers.0.self_attn.o_proj",
    "model.layers.0.mlp",
    "model.layers.0.mlp.gate_up_proj",
    "model.layers.0.mlp.experts",
    "lm_head",
}
PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
L = "model.layers.0."


def test_packed_shards_and_their_biases_group_by_fused_module():
    names = [L + f"self_attn.{p}_proj.{k}" for p in "qkvo" for k in ("weight", "bias")]
    names += [L + "mlp.gate_proj.weight", L + "mlp.up_proj.weight", "lm_head.weight"]
    groups = group(names, MODULES, None, PACKED)
    assert groups == {
        L + "mlp.gate_up_proj": [L + "mlp.gate_proj.weight", L + "mlp.up_proj.weight"],
        L + "self_attn.o_proj": [L + "self_attn.o_proj.bias", L + "self_attn.o_proj.weight"],
        L + "self_attn.qkv_proj": sorted(
            L + f"self_attn.{p}_proj.{k}" for p in "qkv" for k in ("weight", "bias")
        ),
    }


def test_the_models_own_name_mapping_goes_first():
    mapping = {"w.q": "model.layers.0.self_attn.qkv_proj.weight"}
    assert module_of("w.q", MODULES, mapping.get, {}) == L + "self_attn.qkv_proj"


def test_unknown_paths_fall_back_to_the_nearest_existing_module():
    # Experts' checkpoint names lie below the one fused experts module.
    a, b = L + "mlp.experts.0.w1.weight", L + "mlp.experts.7.w2.weight"
    assert group([a, b], MODULES, None, PACKED) == {L + "mlp.experts": [a, b]}
    # Ignored by the model: alone.
    assert module_of("rotary.inv_freq", MODULES, lambda n: None, PACKED) == "rotary.inv_freq"
