"""The model being planned: its shape and parameter counts, from the catalog, a config.json or a
bare size. Pure: a config file's JSON is parsed by the caller and handed over as a dict.

Parameter counts are computed from the shape, never copied from a table, so the same formula
serves a catalog model, a user's config.json and the example GPT (whose measured per-rank bytes
check it). The catalog's `stated_params` only checks the formula in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.catalog import ModelType
from gpufleet.errors import SpecError


@dataclass(frozen=True)
class Model:
    name: str
    arch: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    max_seq: int
    tied: bool
    params: int  # every parameter of the model
    source: str  # where the shape came from, said in the output
    shape_assumed: bool = False  # True for a bare --params: the shape is a guess
    head_dim: int = 0  # 0: hidden // heads (a config may set another, e.g. Mistral NeMo)

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden // self.heads


def _linear(n_in: int, n_out: int, bias: bool) -> int:
    return n_in * n_out + (n_out if bias else 0)


def layer_matrices(arch: str, hidden: int, kv_dim: int, ffn: int,
                   q_dim: int | None = None) -> list[tuple[int, int]]:
    """(in, out) of every weight matrix in one transformer block: q, k, v, o, then the MLP's.

    GPT-2's MLP has two matrices; Llama's SwiGLU three (gate, up, down). Grouped-query attention
    gives k and v `kv_dim` = kv_heads x head_dim outputs instead of `hidden`; q and o span
    `q_dim` = heads x head_dim, which is `hidden` unless a config sets its own head_dim.
    """
    q = q_dim or hidden
    attention = [(hidden, q), (hidden, kv_dim), (hidden, kv_dim), (q, hidden)]
    mlp = [(hidden, ffn), (ffn, hidden)] if arch == "gpt2" else [(hidden, ffn), (hidden, ffn), (ffn, hidden)]
    return attention + mlp


def layer_params(arch: str, hidden: int, heads: int, kv_heads: int, ffn: int, head_dim: int = 0) -> int:
    """Parameters of one block: its matrices (with biases for GPT-2) and its two norms
    (LayerNorm has a weight and a bias, RMSNorm a weight only)."""
    size = head_dim or hidden // heads
    bias = arch == "gpt2"
    matrices = sum(_linear(i, o, bias)
                   for i, o in layer_matrices(arch, hidden, kv_heads * size, ffn, heads * size))
    norms = 2 * (2 * hidden if bias else hidden)
    return matrices + norms


def param_count(arch: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int,
                vocab: int, max_seq: int, tied: bool, head_dim: int = 0) -> int:
    """Every parameter: token embedding (plus learned positions for GPT-2), the blocks, the
    final norm and the output head unless it shares the embedding matrix."""
    gpt2 = arch == "gpt2"
    embedding = vocab * hidden + (max_seq * hidden if gpt2 else 0)
    final_norm = 2 * hidden if gpt2 else hidden
    head = 0 if tied else vocab * hidden
    blocks = layers * layer_params(arch, hidden, heads, kv_heads, ffn, head_dim)
    return embedding + blocks + final_norm + head


def lora_params(model: Model, rank: int) -> int:
    """Trainable parameters of LoRA adapters of `rank` on every block matrix: each (in, out)
    matrix W gets A (in x r) and B (r x out), r(in + out) parameters (Hu et al. 2021, section 4)."""
    size = model.head_size
    matrices = layer_matrices(model.arch, model.hidden, model.kv_heads * size, model.ffn, model.heads * size)
    per_layer = sum(rank * (i + o) for i, o in matrices)
    return model.layers * per_layer


def from_catalog(m: ModelType) -> Model:
    params = param_count(m.arch, m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.vocab, m.seq, m.tied)
    return Model(name=m.name, arch=m.arch, layers=m.layers, hidden=m.hidden, heads=m.heads,
                 kv_heads=m.kv_heads, ffn=m.ffn, vocab=m.vocab, max_seq=m.seq, tied=m.tied,
                 params=params, source=f"catalog: {m.name}")


# Hugging Face config keys: Llama-family names first, GPT-2's second.
_KEYS = {
    "layers": ("num_hidden_layers", "n_layer"),
    "hidden": ("hidden_size", "n_embd"),
    "heads": ("num_attention_heads", "n_head"),
    "vocab": ("vocab_size",),
}


def _pick(cfg: dict[str, Any], names: tuple[str, ...]) -> Any:
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return None


def from_hf_config(cfg: dict[str, Any], name: str) -> Model:
    """A model from a Hugging Face-style config.json: Llama/Mistral keys (`num_hidden_layers`,
    `hidden_size`, `intermediate_size`, `num_key_value_heads`, ...) or GPT-2's (`n_layer`,
    `n_embd`, `n_head`, `n_inner`, `n_positions`). Raises SpecError naming missing keys."""
    values = {field: _pick(cfg, keys) for field, keys in _KEYS.items()}
    missing = [" or ".join(_KEYS[f]) for f, v in values.items() if v is None]
    if missing:
        raise SpecError([("config", f"{name} lacks {', '.join(missing)}; it needs a Hugging Face "
                          "config.json of a decoder-only transformer (Llama, Mistral, GPT-2 style)")])
    experts = _pick(cfg, ("num_local_experts", "num_experts", "n_routed_experts"))
    if experts not in (None, 0, 1):
        raise SpecError([("config", f"{name} is a mixture-of-experts model ({experts} experts); the "
                          "planner models dense transformers only")])

    def number(keys: tuple[str, ...], default: int) -> int:
        value = _pick(cfg, keys)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value) or value < 1:
            raise SpecError([("config", f"{name}: {keys[0]} must be a positive integer, got {value!r}")])
        return int(value)

    layers, hidden, heads, vocab = (number(_KEYS[k], 0) for k in ("layers", "hidden", "heads", "vocab"))
    head_dim = number(("head_dim",), 0)
    if not head_dim and hidden % heads:
        raise SpecError([("config", f"{name}: hidden_size ({hidden}) must divide by the head count "
                          f"({heads}), or head_dim must be given")])
    kv_heads = number(("num_key_value_heads",), heads)
    if heads % kv_heads:
        raise SpecError([("config", f"{name}: num_key_value_heads ({kv_heads}) must divide "
                          f"num_attention_heads ({heads})")])
    gpt2 = str(cfg.get("model_type", "")).lower() == "gpt2" or "n_embd" in cfg
    arch = "gpt2" if gpt2 else "llama"
    ffn = number(("intermediate_size", "n_inner"), 4 * hidden)
    max_seq = number(("max_position_embeddings", "n_positions", "n_ctx"), 2048)
    tie = cfg.get("tie_word_embeddings")
    tied = gpt2 if tie is None else bool(tie)  # HF's default: GPT-2 ties, Llama does not
    if head_dim == hidden // heads:
        head_dim = 0
    params = param_count(arch, layers, hidden, heads, kv_heads, ffn, vocab, max_seq, tied, head_dim)
    label = str(cfg.get("_name_or_path") or name)
    return Model(name=label, arch=arch, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                 ffn=ffn, vocab=vocab, max_seq=max_seq, tied=tied, params=params,
                 source=f"config: {name}", head_dim=head_dim)


ASPECT = 128  # hidden / layers, and the head size, of the assumed shape for a bare size


def from_params(params: float) -> Model:
    """A model known only by its size. Memory for weights, gradients and optimizer needs only the
    count; activations and tensor parallelism need a shape, so one is assumed: hidden = 128 x
    layers with 128-wide heads, as GPT-3 (96 x 12288) and Llama 2 7B (32 x 4096) have, sized so
    that 12 x layers x hidden^2 (the blocks' weights with a 4h MLP, GPT style) equals the count."""
    n = int(params)
    if n < 1:
        raise SpecError([("params", f"got {params:g}; must be a positive parameter count, e.g. 7e9")])
    layers = max(1, round((n / (12 * ASPECT**2)) ** (1 / 3)))
    hidden = ASPECT * layers
    return Model(name=f"{n / 1e9:.3g}B params" if n >= 1e9 else f"{n / 1e6:.3g}M params",
                 arch="gpt2", layers=layers, hidden=hidden, heads=max(1, hidden // ASPECT),
                 kv_heads=max(1, hidden // ASPECT), ffn=4 * hidden, vocab=32000, max_seq=4096,
                 tied=False, params=n, source="--params (shape assumed: hidden = 128 x layers)",
                 shape_assumed=True)


def describe(model: Model) -> str:
    size = f"{model.params / 1e9:.2f}B" if model.params >= 1e9 else f"{model.params / 1e6:.2f}M"
    shape = (f"{model.layers} layers x {model.hidden} hidden, {model.heads} heads"
             + (f" ({model.kv_heads} KV)" if model.kv_heads != model.heads else ""))
    return f"{model.name}: {size} parameters, {shape}" + (" (assumed)" if model.shape_assumed else "")


def gib(n_bytes: float) -> float:
    return n_bytes / 2**30

