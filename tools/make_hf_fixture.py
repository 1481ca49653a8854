#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Builds the HF-fidelity fixtures the trainer's tests compare against.

Writes three tiny random transformers ``Qwen2ForCausalLM`` models with their loss and float64
gradients on a fixed token sequence:

  tests/trainer/fixtures/hf_tiny/        untied LM head, 4 query heads / 2 KV heads (GQA 2), head_dim 8
  tests/trainer/fixtures/hf_tiny_tied/   tied LM head,   4 query heads / 1 KV head  (GQA 4), head_dim 8
  tests/trainer/fixtures/hf_d64/         untied LM head, 2 query heads / 1 KV head  (GQA 2), head_dim 64
                                         (the smallest shape the GPU attention kernels take)

Each folder holds
  config.json             the config exactly as ``save_pretrained`` wrote it
  model.safetensors       the weights, F32, as ``save_pretrained`` wrote them (HF Qwen2 names)
  tokens.bin              the token sequence as an OOMBTOKS token file (docs/formats.md)
  reference.json          loss, tokens, sizes, how it was computed, library versions
  gradients.safetensors   d loss / d parameter, F64, under the parameter names

Every parameter matters: weights, biases and norm weights are drawn at random (norm weights
around 1), so a wrong convention anywhere (transposes, rotate-half, GQA grouping, tying, the
bias on q/k/v only) shows in the loss or a gradient.

The reference is computed in float64 *from the F32-rounded weights* (the model is built in
float32, saved, then converted to float64, which is exact), so a double-precision C++ model that
loads model.safetensors computes the same function. Three places where transformers computes in
float32 even for a float64 model are replaced by their float64 equivalents so the reference is
float64 throughout: RMSNorm's internal upcast, eager attention's float32 softmax, and the rotary
embedding, whose angles are computed here in float64 as DESIGN.md asks of the trainer
(angle = position * theta^(-2i/head_dim), i < head_dim/2) with cos/sin then rounded to float32 and
used as float64 (the trainer stores cos/sin as fp32). The stock float32 transformers loss is
recorded beside it (``loss_stock_transformers_fp32``) to show the difference is fp32 rounding only,
and the float64 loss is checked against an independent re-implementation of the architecture
written out below (``independent_loss``) to 1e-13.

Loss: the sum of next-token cross-entropies over the N-1 targets divided by N-1 (DESIGN.md).

Regenerate (PyTorch and transformers from PyPI; nothing else is downloaded):
  python3 -m venv /tmp/oomb-fixture-venv
  /tmp/oomb-fixture-venv/bin/pip install torch transformers safetensors
  /tmp/oomb-fixture-venv/bin/python tools/make_hf_fixture.py
The output is deterministic for a given torch version (seeded); the committed fixtures were made
with the versions named in each reference.json.
"""

import argparse
import json
import math
import os
import shutil
import struct
import tempfile
import types

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2 import modeling_qwen2

NUM_TOKENS = 43  # prime: not a multiple of any chunk or page size


def rmsnorm_forward_f64(self, hidden_states):
    # Qwen2RMSNorm without the float32 upcast: same formula, in the input's dtype.
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def eager_attention_f64(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    # transformers' eager attention with the softmax kept in the query's dtype.
    key_states = modeling_qwen2.repeat_kv(key, module.num_key_value_groups)
    value_states = modeling_qwen2.repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    else:  # plain causal mask
        n = query.shape[-2]
        causal = torch.triu(torch.full((n, n), float("-inf"), dtype=query.dtype), diagonal=1)
        attn_weights = attn_weights + causal
    attn_weights = torch.softmax(attn_weights, dim=-1)
    attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()
    return attn_output, attn_weights


def make_rotary_forward_f64(theta, head_dim):
    def forward(self, x, position_ids):
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        angles = position_ids[..., None].to(torch.float64) * inv_freq  # [batch, seq, head_dim/2]
        emb = torch.cat((angles, angles), dim=-1)
        cos = emb.cos().to(torch.float32).to(torch.float64)  # stored as fp32, as the trainer does
        sin = emb.sin().to(torch.float32).to(torch.float64)
        return cos.to(x.dtype), sin.to(x.dtype)

    return forward


def make_f64_reference(model, theta, head_dim):
    """Switches a float64 model's float32 islands to float64 (see the module docstring)."""
    for m in model.modules():
        if isinstance(m, modeling_qwen2.Qwen2RMSNorm):
            m.forward = types.MethodType(rmsnorm_forward_f64, m)
        if isinstance(m, modeling_qwen2.Qwen2RotaryEmbedding):
            m.forward = types.MethodType(make_rotary_forward_f64(theta, head_dim), m)
    modeling_qwen2.eager_attention_forward = eager_attention_f64
    model.config._attn_implementation = "eager"


def independent_loss(params, config, tokens):
    """The same model written out from the architecture's description, in float64, as a check that
    the patched transformers model computes what the docstring says (not used for the fixture)."""
    h, nh, nkv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    d = h // nh
    theta = config.rope_parameters["rope_theta"]
    n = len(tokens)
    ids = torch.tensor(tokens)

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps))

    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv
    cos = torch.cat((ang, ang), -1).cos().float().double()
    sin = torch.cat((ang, ang), -1).sin().float().double()

    def rope(x):  # [heads, n, d]
        rot = torch.cat((-x[..., d // 2:], x[..., : d // 2]), -1)
        return x * cos + rot * sin

    x = params["model.embed_tokens.weight"][ids]
    for layer in range(config.num_hidden_layers):
        p = lambda k: params["model.layers.%d.%s" % (layer, k)]
        a = rms(x, p("input_layernorm.weight"))
        q = (a @ p("self_attn.q_proj.weight").T + p("self_attn.q_proj.bias")).view(n, nh, d).transpose(0, 1)
        k = (a @ p("self_attn.k_proj.weight").T + p("self_attn.k_proj.bias")).view(n, nkv, d).transpose(0, 1)
        v = (a @ p("self_attn.v_proj.weight").T + p("self_attn.v_proj.bias")).view(n, nkv, d).transpose(0, 1)
        q, k = rope(q), rope(k)
        group = nh // nkv
        k = k.repeat_interleave(group, 0)  # query head j reads KV head j // group
        v = v.repeat_interleave(group, 0)
        s = q @ k.transpose(1, 2) / math.sqrt(d)
        s = s + torch.triu(torch.full((n, n), float("-inf"), dtype=torch.float64), 1)
        o = (torch.softmax(s, -1) @ v).transpose(0, 1).reshape(n, h)
        x = x + o @ p("self_attn.o_proj.weight").T
        b = rms(x, p("post_attention_layernorm.weight"))
        g = b @ p("mlp.gate_proj.weight").T
        u = b @ p("mlp.up_proj.weight").T
        x = x + (F.silu(g) * u) @ p("mlp.down_proj.weight").T
    x = rms(x, params["model.norm.weight"])
    head = params["model.embed_tokens.weight"] if config.tie_word_embeddings else params["lm_head.weight"]
    logits = x @ head.T
    return F.cross_entropy(logits[:-1], ids[1:], reduction="sum") / (n - 1)


def loss_of(model, tokens):
    ids = torch.tensor([tokens], dtype=torch.long)
    logits = model(input_ids=ids).logits[0]  # [N, vocab]
    n = len(tokens)
    return F.cross_entropy(logits[:-1], ids[0, 1:], reduction="sum") / (n - 1)


def write_token_file(path, tokens, vocab):
    with open(path, "wb") as f:
        f.write(b"OOMBTOKS" + struct.pack("<IIQII", 1, 32, len(tokens), vocab, 0))
        f.write(struct.pack("<%dI" % len(tokens), *tokens))


def build(out_dir, tied, num_kv_heads, seed, num_heads=4, head_dim=8, intermediate=24):
    theta = 10000.0
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=num_heads * head_dim,
        intermediate_size=intermediate,
        num_hidden_layers=2,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=128,
        rope_theta=theta,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tied,
        attention_dropout=0.0,
        use_sliding_window=False,
    )
    config._attn_implementation = "eager"
    head_dim = config.hidden_size // config.num_attention_heads
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.eval()  # no dropout (there is none anyway)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn_like(p))
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(0.35 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[1]) * 1.2)
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, config.vocab_size, (NUM_TOKENS,), generator=gen).tolist()

    with torch.no_grad():
        stock_loss = loss_of(model, tokens).item()  # transformers as shipped, float32

    os.makedirs(os.path.dirname(out_dir) or ".", exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(out_dir) + ".tmp-", dir=os.path.dirname(out_dir))
    model.save_pretrained(tmp, safe_serialization=True)
    for extra in os.listdir(tmp):
        if extra not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(tmp, extra))  # generation_config.json: not ours to test

    model64 = model.to(torch.float64)  # exact: every F32 weight is a float64
    make_f64_reference(model64, theta, head_dim)
    loss = loss_of(model64, tokens)
    with torch.no_grad():
        params = {k: v.detach() for k, v in model64.named_parameters()}
        check = independent_loss(params, config, tokens).item()
    assert abs(check - loss.item()) <= 1e-13 * abs(loss.item()), (check, loss.item())
    model64.zero_grad()
    loss.backward()
    grads = {}
    for name, p in model64.named_parameters():  # a tied head appears once, as embed_tokens
        assert p.grad is not None, name
        grads[name] = p.grad.detach().clone().contiguous()
    save_file(grads, os.path.join(tmp, "gradients.safetensors"), metadata={"loss": repr(loss.item())})
    write_token_file(os.path.join(tmp, "tokens.bin"), tokens, config.vocab_size)
    reference = {
        "loss": loss.item(),
        "loss_stock_transformers_fp32": stock_loss,
        "num_tokens": len(tokens),
        "num_targets": len(tokens) - 1,
        "tokens": tokens,
        "tie_word_embeddings": tied,
        "parameters": sorted(grads),
        "computation": "float64 from the F32 weights; loss = sum of next-token cross-entropies / (N-1); "
                       "RMSNorm and softmax in float64; RoPE angle = position * theta^(-2i/head_dim) in "
                       "float64, cos/sin rounded to float32, rotate-half convention",
        "generator": "tools/make_hf_fixture.py seed %d" % seed,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    with open(os.path.join(tmp, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1)
        f.write("\n")
    os.chmod(tmp, 0o755)
    for x in os.listdir(tmp):
        os.chmod(os.path.join(tmp, x), 0o644)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    os.rename(tmp, out_dir)
    size = sum(os.path.getsize(os.path.join(out_dir, x)) for x in os.listdir(out_dir))
    print("%s: loss %.17g (stock fp32 transformers %.9g), %d parameters, %d bytes"
          % (out_dir, loss.item(), stock_loss, sum(g.numel() for g in grads.values()), size))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.join(here, "..", "tests", "trainer", "fixtures")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=default_out, help="fixtures folder (default: %(default)s)")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    build(os.path.join(args.out, "hf_tiny"), tied=False, num_kv_heads=2, seed=1234)
    build(os.path.join(args.out, "hf_tiny_tied"), tied=True, num_kv_heads=1, seed=5678)
    build(os.path.join(args.out, "hf_d64"), tied=False, num_kv_heads=1, seed=4321, num_heads=2, head_dim=64,
          intermediate=64)


if __name__ == "__main__":
    main()
