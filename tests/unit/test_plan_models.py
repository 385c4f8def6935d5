"""The planner's model shapes and parameter counts (gpufleet.plan.models), checked on hand-computed
small shapes, on the catalog's published sizes and on two well-known exact counts."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet import catalog
from gpufleet.errors import SpecError
from gpufleet.plan import models
from gpufleet.plan.models import from_catalog, from_hf_config, from_params, lora_params, param_count

# -- param_count on tiny shapes ---------------------------------------------------------------


def test_gpt2_tiny_untied_by_hand() -> None:
    # gpt2 arch, layers=1, hidden=4, heads=2 (kv_heads=2, so kv_dim=4), ffn=16, vocab=10, seq=3.
    # embedding: tokens 10*4 = 40 + learned positions 3*4 = 12                        -> 52
    # block: q, k, v, o each 4*4 weights + 4 bias = 20                      -> 4*20 = 80
    #        MLP up 4*16 + 16 = 80, down 16*4 + 4 = 68                                 -> 148
    #        two LayerNorms, weight + bias each: 2*(2*4)                               -> 16
    #        block total 80 + 148 + 16                                                 -> 244
    # final LayerNorm 2*4                                                              -> 8
    # untied output head 10*4                                                          -> 40
    # total 52 + 244 + 8 + 40                                                          -> 344
    assert param_count("gpt2", 1, 4, 2, 2, 16, 10, 3, tied=False) == 344


def test_gpt2_tiny_tied_drops_the_head() -> None:
    # the same shape with the head sharing the embedding: 344 - 10*4 = 304
    assert param_count("gpt2", 1, 4, 2, 2, 16, 10, 3, tied=True) == 304


def test_gpt2_two_layers_adds_one_block() -> None:
    # one more block of 244 (see above): 344 + 244 = 588
    assert param_count("gpt2", 2, 4, 2, 2, 16, 10, 3, tied=False) == 588


def test_llama_tiny_gqa_by_hand() -> None:
    # llama arch, layers=1, hidden=8, heads=4, kv_heads=2, ffn=16, vocab=10, untied.
    # head_dim = 8/4 = 2, kv_dim = 2*2 = 4; no biases, RMSNorm has a weight only.
    # embedding: 10*8 = 80 (rotary positions have no parameters; max_seq ignored)   -> 80
    # attention: q 8*8 = 64, k 8*4 = 32, v 8*4 = 32, o 8*8 = 64                      -> 192
    # SwiGLU: gate 8*16 = 128, up 8*16 = 128, down 16*8 = 128                        -> 384
    # two RMSNorms 2*8                                                               -> 16
    # block total 192 + 384 + 16                                                     -> 592
    # final RMSNorm 8, untied head 10*8 = 80
    # total 80 + 592 + 8 + 80                                                        -> 760
    assert param_count("llama", 1, 8, 4, 2, 16, 10, 3, tied=False) == 760


def test_llama_positions_do_not_count() -> None:
    # max_seq only matters for GPT-2's learned positions
    assert param_count("llama", 1, 8, 4, 2, 16, 10, 3, False) == param_count(
        "llama", 1, 8, 4, 2, 16, 10, 4096, False)


def test_llama_without_gqa_by_hand() -> None:
    # kv_heads = heads = 4: k and v become 8*8 = 64 each instead of 32, +64 over the GQA case: 824
    assert param_count("llama", 1, 8, 4, 4, 16, 10, 3, tied=False) == 824


# -- catalog against published numbers --------------------------------------------------------


@pytest.mark.parametrize("name", list(catalog.models()))
def test_catalog_count_within_one_percent_of_stated(name: str) -> None:
    m = catalog.models()[name]
    computed = from_catalog(m).params
    assert computed == pytest.approx(m.stated_params, rel=0.01), (name, computed, m.stated_params)


def test_gpt2_small_exact() -> None:
    # Hugging Face's openai-community/gpt2: 124,439,808 parameters
    assert from_catalog(catalog.models()["gpt2"]).params == 124_439_808


def test_llama3_8b_exact() -> None:
    # meta-llama/Meta-Llama-3-8B: 8,030,261,248 parameters
    assert from_catalog(catalog.models()["llama3-8b"]).params == 8_030_261_248


def test_from_catalog_copies_the_shape() -> None:
    m = from_catalog(catalog.models()["llama3-8b"])
    assert (m.arch, m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.vocab, m.max_seq, m.tied) == (
        "llama", 32, 4096, 32, 8, 14336, 128256, 8192, False)
    assert m.source == "catalog: llama3-8b"
    assert m.shape_assumed is False


# -- Hugging Face config.json ------------------------------------------------------------------

LLAMA_CFG: dict[str, Any] = {
    "model_type": "llama", "num_hidden_layers": 1, "hidden_size": 8, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 16, "vocab_size": 10, "max_position_embeddings": 3,
}
GPT2_CFG: dict[str, Any] = {
    "model_type": "gpt2", "n_layer": 1, "n_embd": 4, "n_head": 2, "n_inner": None, "vocab_size": 10,
    "n_positions": 3,
}


def test_hf_llama_config() -> None:
    m = from_hf_config(dict(LLAMA_CFG), "cfg.json")
    assert m.arch == "llama"
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.vocab, m.max_seq) == (1, 8, 4, 2, 16, 10, 3)
    assert m.tied is False  # HF's LlamaConfig default
    assert m.params == 760  # the hand count of test_llama_tiny_gqa_by_hand
    assert m.name == "cfg.json"
    assert m.source == "config: cfg.json"


def test_hf_llama_config_tied_when_told() -> None:
    m = from_hf_config({**LLAMA_CFG, "tie_word_embeddings": True}, "cfg.json")
    assert m.tied is True
    assert m.params == 760 - 10 * 8


def test_hf_llama_config_without_kv_heads_is_mha() -> None:
    cfg = {k: v for k, v in LLAMA_CFG.items() if k != "num_key_value_heads"}
    m = from_hf_config(cfg, "cfg.json")
    assert m.kv_heads == 4
    assert m.params == 824  # test_llama_without_gqa_by_hand


def test_hf_gpt2_config() -> None:
    m = from_hf_config(dict(GPT2_CFG), "gpt2.json")
    assert m.arch == "gpt2"
    assert m.ffn == 16  # n_inner None -> 4 * n_embd
    assert m.tied is True  # HF's GPT2Config default
    assert m.max_seq == 3
    assert m.params == 304  # test_gpt2_tiny_tied_drops_the_head


def test_hf_gpt2_detected_by_keys_without_model_type() -> None:
    cfg = {k: v for k, v in GPT2_CFG.items() if k != "model_type"}
    m = from_hf_config(cfg, "gpt2.json")
    assert m.arch == "gpt2"
    assert m.tied is True


def test_hf_name_or_path_names_the_model() -> None:
    m = from_hf_config({**LLAMA_CFG, "_name_or_path": "org/tiny"}, "cfg.json")
    assert m.name == "org/tiny"
    assert m.source == "config: cfg.json"


def test_hf_missing_keys_named() -> None:
    with pytest.raises(SpecError) as err:
        from_hf_config({"hidden_size": 8}, "bad.json")
    [(field, msg)] = err.value.problems
    assert field == "config"
    assert "bad.json" in msg
    for key in ("num_hidden_layers or n_layer", "num_attention_heads or n_head", "vocab_size"):
        assert key in msg
    assert "hidden_size" not in msg.split("lacks", 1)[1].split(";")[0]


def test_hf_hidden_not_divisible_by_heads() -> None:
    with pytest.raises(SpecError) as err:
        from_hf_config({**LLAMA_CFG, "hidden_size": 10}, "cfg.json")
    [(field, msg)] = err.value.problems
    assert field == "config"
    assert "must divide by the head count" in msg


def test_hf_non_integer_sizes() -> None:
    with pytest.raises(SpecError) as err:
        from_hf_config({**LLAMA_CFG, "hidden_size": "big"}, "cfg.json")
    assert err.value.problems[0][0] == "config"


# -- a bare --params --------------------------------------------------------------------------


@pytest.mark.parametrize("n", [7e9, 70e9, 405e9])
def test_from_params_shape_rule(n: float) -> None:
    m = from_params(n)
    assert m.hidden == 128 * m.layers
    assert m.heads == m.kv_heads == m.hidden // 128
    assert m.ffn == 4 * m.hidden
    # 12 * L * h^2 = 12 * 128^2 * L^3 is the count, up to rounding L to an integer
    assert 12 * m.layers * m.hidden**2 == pytest.approx(n, rel=0.02)
    # and L is that cube root rounded
    assert m.layers == round((n / (12 * 128**2)) ** (1 / 3))


def test_from_params_7b_shape() -> None:
    # (7e9 / (12 * 16384)) ** (1/3) = 32.9 -> 33 layers, hidden 33 * 128 = 4224
    m = from_params(7e9)
    assert (m.layers, m.hidden) == (33, 4224)


def test_from_params_keeps_the_count_exactly() -> None:
    m = from_params(6_738_415_616)
    assert m.params == 6_738_415_616
    assert m.shape_assumed is True
    assert m.arch == "gpt2"  # a 4h two-matrix MLP: 12 x L x h^2 per the docstring
    assert m.name == "6.74B params"


def test_from_params_small() -> None:
    m = from_params(1)
    assert (m.layers, m.hidden, m.heads) == (1, 128, 1)
    assert m.params == 1
    assert m.name == "1e-06M params"


@pytest.mark.parametrize("n", [0, -5, 0.5])
def test_from_params_nonpositive(n: float) -> None:
    with pytest.raises(SpecError) as err:
        from_params(n)
    assert err.value.problems[0][0] == "params"


# -- LoRA ---------------------------------------------------------------------------------------


def test_lora_llama_tiny_by_hand() -> None:
    # the llama shape above (h=8, kv_dim=4, ffn=16), rank 2; r*(in+out) per matrix:
    # q (8,8) 16, k (8,4) 12, v (8,4) 12, o (8,8) 16, gate (8,16) 24, up (8,16) 24, down (16,8) 24
    # sum 128, times r=2 -> 256 per layer, 1 layer -> 256
    m = from_hf_config(dict(LLAMA_CFG), "cfg.json")
    assert lora_params(m, 2) == 256


def test_lora_gpt2_tiny_by_hand() -> None:
    # gpt2 shape h=4, ffn=16, rank 1, 2 layers: q,k,v,o 4 * (4+4) = 32, up 4+16 = 20, down 16+4 = 20
    # -> 72 per layer, 144 for two
    m = from_hf_config({**GPT2_CFG, "n_layer": 2}, "gpt2.json")
    assert lora_params(m, 1) == 144


def test_lora_scales_with_rank() -> None:
    m = from_catalog(catalog.models()["llama3-8b"])
    assert lora_params(m, 16) == 2 * lora_params(m, 8)


def test_describe_and_gib() -> None:
    m = from_catalog(catalog.models()["llama3-8b"])
    assert models.describe(m) == "llama3-8b: 8.03B parameters, 32 layers x 4096 hidden, 32 heads (8 KV)"
    assert models.describe(from_params(7e9)).endswith("(assumed)")
    assert models.gib(2**30) == 1.0


def test_hf_null_tie_means_the_architecture_default() -> None:
    # "tie_word_embeddings": null is Hugging Face's "not set": GPT-2 ties, Llama does not
    assert from_hf_config({**GPT2_CFG, "tie_word_embeddings": None}, "g.json").tied is True


@pytest.mark.parametrize("key, value, text", [
    ("intermediate_size", "abc", "intermediate_size must be a positive integer"),
    ("max_position_embeddings", [1], "max_position_embeddings must be a positive integer"),
    ("num_key_value_heads", -2, "num_key_value_heads must be a positive integer"),
    ("num_key_value_heads", 3, "must divide num_attention_heads"),
    ("num_local_experts", 8, "mixture-of-experts"),
])
def test_hf_bad_values_are_one_spec_error(key: str, value: Any, text: str) -> None:
    with pytest.raises(SpecError) as err:
        from_hf_config({**LLAMA_CFG, key: value}, "cfg.json")
    assert text in str(err.value)


def test_hf_head_dim_sets_the_attention_width() -> None:
    # q: h x (heads*hd), o: (heads*hd) x h, k and v: h x (kv*hd); no biases (llama)
    cfg = {**LLAMA_CFG, "head_dim": 2 * LLAMA_CFG["hidden_size"] // LLAMA_CFG["num_attention_heads"]}
    wide, plain = from_hf_config(cfg, "w.json"), from_hf_config(dict(LLAMA_CFG), "p.json")
    h, a, kv = LLAMA_CFG["hidden_size"], LLAMA_CFG["num_attention_heads"], LLAMA_CFG["num_key_value_heads"]
    hd = cfg["head_dim"]
    extra_per_layer = (2 * h * a * hd + 2 * h * kv * hd) - (2 * h * h + 2 * h * kv * (h // a))
    assert wide.params - plain.params == LLAMA_CFG["num_hidden_layers"] * extra_per_layer
