# SPDX-License-Identifier: Apache-2.0
"""Tiny random models of each tested family, built by transformers here (no downloads), and the
full-sequence reference every test compares with."""
import atexit
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# torch.compile's caches of this run only: a graph another checkout compiled (its ops' schemas
# older or newer) must not be reused here.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="oomb-inductor-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))

VOCAB = 101
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
              attn_implementation="sdpa")


def make_model(family: str, dtype=torch.float64, seed: int = 0, weight_std: float = 0.3, **overrides):
    """A tiny random causal LM of `family`, its weights drawn from `seed` (matrices N(0, weight_std)),
    in `dtype`, eval mode."""
    torch.manual_seed(seed)
    kw = dict(COMMON)
    if family == "qwen2":
        # Qwen2 configs carry a sliding_window even when use_sliding_window is false: it must work.
        kw.update(use_sliding_window=False, sliding_window=16)
        kw.update(overrides)
        cfg, cls = transformers.Qwen2Config(**kw), transformers.Qwen2ForCausalLM
    elif family == "llama":
        kw.update(rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                                       high_freq_factor=4.0, original_max_position_embeddings=32),
                  attention_bias=True)
        kw.update(overrides)
        cfg, cls = transformers.LlamaConfig(**kw), transformers.LlamaForCausalLM
    elif family == "qwen3":
        kw.update(head_dim=16)  # not hidden_size / heads = 8; q/k norms are Qwen3's own
        kw.update(overrides)
        cfg, cls = transformers.Qwen3Config(**kw), transformers.Qwen3ForCausalLM
    elif family == "mistral":
        kw.update(num_key_value_heads=1)  # GQA 4; sliding_window 4096 (its default) >= any test sequence
        kw.update(overrides)
        cfg, cls = transformers.MistralConfig(**kw), transformers.MistralForCausalLM
    else:
        raise ValueError(family)
    model = cls(cfg).to(dtype)
    # Random weights a little larger than the init's, so attention is far from uniform.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, weight_std)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.1)
    model.eval()
    return model


FAMILIES = ["qwen2", "llama", "qwen3", "mistral"]


def reference_grads(model, ids, targets, position_ids=None):
    """Full-sequence backprop (the model's own attention, sdpa) of HF's loss computed in the model's
    dtype: sum of cross-entropies over targets != -100 divided by their number. targets[b, i] is
    the label token i predicts; position_ids as the model takes them (default 0, 1, ...)."""
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, position_ids=position_ids, use_cache=False).logits
    count = int((targets != -100).sum())
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                             ignore_index=-100, reduction="sum") / count
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def shift(labels):
    return torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)


def worst_error(model, ref):
    """max over parameters of |g - g_ref| / |g_ref| (norm-wise per tensor)."""
    worst, where = 0.0, None
    for n, p in model.named_parameters():
        assert p.grad is not None, f"{n} got no gradient"
        e = float((p.grad - ref[n]).norm() / ref[n].norm().clamp_min(1e-300))
        if e > worst:
            worst, where = e, n
    return worst, where


@pytest.fixture
def ids_of():
    def make(n, batch=1, seed=1):
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, VOCAB, (batch, n), generator=g)
    return make
