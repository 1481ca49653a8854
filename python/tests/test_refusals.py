# SPDX-License-Identifier: Apache-2.0
"""What the driver refuses, with a message, before the first chunk runs."""
import pytest
import torch

from conftest import make_model
from oomb.torch import ChunkRecurrent, Offload, RefusedError, SparseConfig, _oomb_attention, _Run


class Counter:
    """Counts the model's decoder-layer calls: a refusal must come before any."""

    def __init__(self, model):
        self.calls = 0
        for layer in model.model.layers:
            layer.register_forward_pre_hook(self._hook)

    def _hook(self, *_):
        self.calls += 1


def refused(cr, ids, match, **kw):
    counter = Counter(cr.model)
    with pytest.raises(RefusedError, match=match):
        cr.forward_backward(ids, **kw)
    assert counter.calls == 0, "refused only after running the model"
    assert cr.memory()["kv_in_use"] == 0 and cr.memory()["grad_in_use"] == 0
    assert cr.model.config._attn_implementation == "sdpa"


def test_attention_mask_with_zeros(ids_of):
    cr = ChunkRecurrent(make_model("qwen2"), chunk=32, page=16, max_tokens=64)
    ids = ids_of(64)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    refused(cr, ids, "attention_mask has zeros", attention_mask=mask)


def test_sequence_beyond_the_plan(ids_of):
    cr = ChunkRecurrent(make_model("qwen2"), chunk=32, page=16, max_tokens=64)
    refused(cr, ids_of(65), "beyond the plan of max_tokens=64")


def test_no_target(ids_of):
    cr = ChunkRecurrent(make_model("qwen2"), chunk=32, page=16, max_tokens=64)
    ids = ids_of(40)
    refused(cr, ids, "no token has a target", labels=torch.full_like(ids, -100))


def test_sliding_window_shorter_than_the_sequence(ids_of):
    # A Mistral whose window (16) is shorter than the sequence: the call-time check refuses it
    # (layer 0 is the first to attend, so nothing was trained).
    model = make_model("mistral", sliding_window=16)
    cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=64)
    with pytest.raises(RefusedError, match="sliding window of 16 tokens"):
        cr.forward_backward(ids_of(40))
    assert cr.memory()["kv_in_use"] == 0
    assert model.config._attn_implementation == "sdpa"
    assert all(p.grad is None for p in model.parameters())
    # Qwen2 with use_sliding_window true makes its layers sliding ones: refused the same way.
    model = make_model("qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=0)
    cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=64)
    with pytest.raises(RefusedError, match="sliding window of 16 tokens"):
        cr.forward_backward(ids_of(40))


def test_sliding_window_as_long_as_the_sequence_is_full_attention(ids_of):
    model = make_model("mistral", sliding_window=40)
    ChunkRecurrent(model, chunk=32, page=16, max_tokens=64).forward_backward(ids_of(40))


def test_dropout_in_train_mode(ids_of):
    model = make_model("qwen2", attention_dropout=0.1)
    model.train()
    with pytest.raises(RefusedError, match="attention_dropout=0.1 in train mode"):
        ChunkRecurrent(model, chunk=32, page=16, max_tokens=64)
    model.eval()  # eval mode: dropout is off, allowed
    cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=64)
    model.train()
    refused(cr, ids_of(40), "attention_dropout=0.1 in train mode")
    # A layer whose own dropout is set although the config's is not: refused where it attends.
    model = make_model("qwen2")
    cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=64)
    model.train()
    model.model.layers[1].self_attn.attention_dropout = 0.2
    with pytest.raises(RefusedError, match="layer 1 called attention with dropout=0.2"):
        cr.forward_backward(ids_of(40))
    assert cr.memory()["kv_in_use"] == 0


def test_wrong_dtype_and_device():
    with pytest.raises(RefusedError, match="the model is torch.bfloat16"):
        ChunkRecurrent(make_model("qwen2", dtype=torch.bfloat16), chunk=32, page=16, max_tokens=64)
    with pytest.raises(RefusedError, match="the model is on meta; the CPU and CUDA devices are supported"):
        ChunkRecurrent(make_model("qwen2").to("meta"), chunk=32, page=16, max_tokens=64)


def test_input_dtype_and_device(ids_of):
    cr = ChunkRecurrent(make_model("qwen2"), chunk=32, page=16, max_tokens=64)
    refused(cr, ids_of(40).double(), "input_ids must be integer")
    refused(cr, ids_of(40).to("meta"), "input_ids are on meta")


def test_chunk_and_page():
    model = make_model("qwen2")
    with pytest.raises(RefusedError, match="chunk 40 must be a positive multiple of the page size 16"):
        ChunkRecurrent(model, chunk=40, page=16, max_tokens=64)
    with pytest.raises(RefusedError, match="page 24 must be a power of two >= 16"):
        ChunkRecurrent(model, chunk=48, page=24, max_tokens=64)


def test_gradient_checkpointing(ids_of):
    model = make_model("qwen3")
    model.gradient_checkpointing_enable()
    with pytest.raises(RefusedError, match="gradient checkpointing is enabled"):
        ChunkRecurrent(model, chunk=32, page=16, max_tokens=64)
    model.gradient_checkpointing_disable()
    cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=64)
    model.gradient_checkpointing_enable()
    refused(cr, ids_of(40), "gradient checkpointing is enabled")


def test_offload_config():
    with pytest.raises(RefusedError, match="offload must be an oomb.torch.Offload"):
        ChunkRecurrent(make_model("qwen2"), chunk=32, page=16, max_tokens=64, offload=True)
    with pytest.raises(RefusedError, match=r"a window takes 1 to kv_slots // 2 pages"):
        ChunkRecurrent(make_model("qwen2"), chunk=32, page=16, max_tokens=64, offload=Offload(kv_slots=4, window=3))
    with pytest.raises(RefusedError, match="the near tiers need at least 2 slots"):
        ChunkRecurrent(make_model("qwen2"), chunk=16, page=16, max_tokens=64, offload=Offload(kv_slots=1))
    with pytest.raises(RefusedError, match="must hold a chunk's 4 pages of one layer"):
        ChunkRecurrent(make_model("qwen2"), chunk=64, page=16, max_tokens=64, offload=Offload(kv_slots=3))
    with pytest.raises(RefusedError, match="homes is 'pinned' or 'pageable'"):
        ChunkRecurrent(make_model("qwen2"), chunk=32, page=16, max_tokens=64, offload=Offload(kv_slots=4, homes="disk"))
    with pytest.raises(RefusedError, match="homes is the GPU path's"):
        ChunkRecurrent(make_model("qwen2"), chunk=32, page=16, max_tokens=64,
                       offload=Offload(kv_slots=4, homes="pageable"))
    with pytest.raises(RefusedError, match="keep_attention_outputs with sparse is not supported"):
        ChunkRecurrent(make_model("qwen2"), chunk=32, page=16, max_tokens=64, sparse=SparseConfig(budget=1),
                       keep_attention_outputs=True)


def test_attention_outside_the_driver(ids_of):
    model = make_model("qwen2")
    ChunkRecurrent(model, chunk=32, page=16, max_tokens=64)
    model.set_attn_implementation("oomb")
    with pytest.raises(RuntimeError, match="only runs inside ChunkRecurrent.forward_backward"):
        model(input_ids=ids_of(8))


@pytest.mark.parametrize("kwargs,match", [
    (dict(softcap=30.0), "with softcap"),
    (dict(s_aux=torch.zeros(4)), "with s_aux"),
    (dict(is_causal=False), "not causal"),
    (dict(cu_seq_lens_q=torch.zeros(2)), "with cu_seq_lens_q"),
])
def test_attention_variants_not_supported(kwargs, match):
    model = make_model("qwen2")
    cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=64)
    run = _Run(cr, 16)
    run.stage = 1
    q = torch.zeros(1, 4, 16, 8, dtype=torch.float64)
    kv = torch.zeros(1, 2, 16, 8, dtype=torch.float64)
    import oomb.torch as ot
    ot._active = run
    try:
        with pytest.raises(RefusedError, match=match):
            _oomb_attention(model.model.layers[0].self_attn, q, kv, kv, None, scaling=0.3, **kwargs)
        with pytest.raises(RefusedError, match="attends 8 keys for 16 queries"):
            _oomb_attention(model.model.layers[0].self_attn, q, kv[:, :, :8], kv[:, :, :8], None)
        with pytest.raises(RefusedError, match="called attention with a mask"):
            _oomb_attention(model.model.layers[0].self_attn, q, kv, kv, torch.zeros(1, 1, 16, 16))
    finally:
        ot._active = None


def test_a_layer_whose_attention_bypasses_the_registry(ids_of):
    # Layer 1 replaced by one that attends on its own (plain sdpa over the chunk): it would never
    # see the past, so the driver refuses after the first chunk's forward, before any gradient.
    model = make_model("qwen2")
    attn = model.model.layers[1].self_attn

    def own_attention(hidden_states, position_embeddings, attention_mask, **kwargs):
        b, s, _ = hidden_states.shape
        q = attn.q_proj(hidden_states).view(b, s, -1, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(hidden_states).view(b, s, -1, attn.head_dim).transpose(1, 2)
        v = attn.v_proj(hidden_states).view(b, s, -1, attn.head_dim).transpose(1, 2)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return attn.o_proj(o.transpose(1, 2).reshape(b, s, -1)), None

    attn.forward = own_attention
    cr = ChunkRecurrent(model, chunk=32, page=16, max_tokens=64)
    with pytest.raises(RefusedError, match=r"layers \[1\] did not call attention through"):
        cr.forward_backward(ids_of(64))
    assert all(p.grad is None for p in model.parameters())
    assert cr.memory()["kv_in_use"] == 0


def test_paged_session_refuses_calls_out_of_order_or_range():
    # The paged session (oomb.paged) is a C ABI over the trainer's paged attention: a call outside
    # the plan or the step is an error with a message, never a crash.
    from oomb._lib import OombError
    from oomb.paged import PagedSession
    s = PagedSession(torch.device("cpu"), dtype=torch.float64, layers=2, hq=4, hkv=2, head_dim=8, chunk=32, page=16,
                     max_tokens=64, offload=False)
    with pytest.raises(OombError, match="a step of 3 chunks; the plan holds 1 to 2"):
        s.begin_step(3)
    s.begin_step(2)
    s.append(32)
    k = torch.randn(32, 2, 8, dtype=torch.float64)
    with pytest.raises(OombError, match=r"layer 2 out of range \[0, 2\)"):
        s.write(2, 0, k, k)
    with pytest.raises(OombError, match=r"chunk 2 out of range \[0, 2\)"):
        s.write(0, 2, k, k)
    with pytest.raises(OombError, match="select on a dense session"):
        s.select(0, 0, torch.randn(32, 4, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="the session needs torch.float64"):
        s.write(0, 0, k.float(), k.float())
    with pytest.raises(OombError, match="a chunk of 33 tokens"):
        s.append(33)
    s.write(0, 0, k, k)
    o, lse = s.forward(0, 0, torch.randn(32, 4, 8, dtype=torch.float64))
    assert o.shape == (32, 4, 8) and lse.shape == (4, 32) and bool(torch.isfinite(o).all())
    s.release_chunk(0)
    assert s.end_step()["kv_in_use"] == 0
    s.close()
    with pytest.raises(RuntimeError, match="used after close"):
        s.append(1)
