# SPDX-License-Identifier: Apache-2.0
"""transformers loads oomb-train's HF folders as they are and computes what the trainer computed.

For every HF fixture (tests/trainer/fixtures/hf_*: a transformers model as save_pretrained wrote it,
with its tokens), oomb-train trains 2 steps on the CPU from it, saving HF folders, and:
  * checkpoint-1 in float32 loads with AutoModelForCausalLM (no missing, unexpected or mismatched
    tensor) and its mean next-token loss on the window step 2 trained on equals step 2's loss in the
    run's log.jsonl (the trainer computed it with exactly those weights, in float32; transformers
    here in float64): relative difference at most 1e-5;
  * the bfloat16 folders (sharded, with model.safetensors.index.json; a checkpoint and --export)
    hold the float32 weights rounded to nearest even, bit for bit as torch rounds them, load, and
    give logits within 3e-2 of the float32 folder's, norm-wise over the window (measured 6e-3 to
    1.2e-2 on the tiny fixtures: 3 to 6 times bfloat16's rounding unit 2^-9; a tensor misplaced or
    misread would be off by O(1));
  * the tokenizer files and generation_config.json of the --init folder come along and load.
A family the trainer does not train yet fails here (oomb-train refuses it): nothing is skipped.

Run by ctest (tests/trainer/CMakeLists.txt, test trainer_hf_export, label cpu) with the Python
environment tools/setup.sh makes; OOMB_TRAIN names the oomb-train binary. Without either it fails.
"""
import json
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest
import safetensors.torch
import torch
import transformers

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)

HERE = pathlib.Path(__file__).resolve().parent
FIXTURES = pathlib.Path(os.environ.get("OOMB_TRAINER_FIXTURES", HERE / "fixtures"))
FIXTURE_DIRS = sorted(p for p in FIXTURES.glob("hf_*") if (p / "config.json").is_file())
LOSS_RTOL = 1e-5
BF16_LOGIT_TOL = 3e-2


def oomb_train():
    exe = os.environ.get("OOMB_TRAIN", "")
    assert exe and os.access(exe, os.X_OK), f"OOMB_TRAIN must name the oomb-train binary (got {exe!r})"
    return exe


def read_tokens(path):
    raw = path.read_bytes()
    assert raw[:8] == b"OOMBTOKS", f"{path}: not a token file"
    return np.frombuffer(raw, dtype="<u4", offset=32).astype(np.int64)


def make_init(fixture, dest):
    """The fixture's model with a tokenizer (a word-level one over its vocabulary) and a generation
    config beside it, as a model folder from the Hub would have."""
    dest.mkdir()
    for name in ("config.json", "model.safetensors", "model.safetensors.index.json"):
        if (fixture / name).exists():
            shutil.copy(fixture / name, dest / name)
    for shard in fixture.glob("model-*-of-*.safetensors"):
        shutil.copy(shard, dest / shard.name)
    vocab_size = json.loads((fixture / "config.json").read_text())["vocab_size"]
    import tokenizers
    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, vocab_size)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="w1")
    fast.save_pretrained(dest)
    transformers.GenerationConfig(eos_token_id=1, max_new_tokens=7).save_pretrained(dest)
    return dest


def run(fixture, init, out, seq, *flags):
    cmd = [oomb_train(), "--config", str(fixture / "config.json"), "--init", str(init), "--data",
           str(fixture / "tokens.bin"), "--seq-len", str(seq), "--chunk", "16", "--steps", "2", "--lr", "1e-2",
           "--save-every", "1", "--keep-last", "3", "--out", str(out), "--device", "cpu", "--quiet", *flags]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"oomb-train exited {r.returncode}:\n{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def load(folder):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64,
                                                                    output_loading_info=True)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        assert not info[key], f"{folder}: {key} {info[key]}"
    return model.eval()


def weights(folder):
    """Every tensor of an HF folder's safetensors (one file or the shards of its index)."""
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    out = {}
    for f in files:
        part = safetensors.torch.load_file(folder / f)
        assert not set(part) & set(out), f"{folder}: a tensor in two shards"
        out.update(part)
    return out


@pytest.mark.parametrize("fixture", FIXTURE_DIRS, ids=[p.name for p in FIXTURE_DIRS])
def test_transformers_loads_the_export(fixture, tmp_path):
    tokens = read_tokens(fixture / "tokens.bin")
    seq = min(20, len(tokens) // 2)
    window2 = torch.tensor(tokens[seq:2 * seq])[None]  # step 2's window: the second seq tokens
    init = make_init(fixture, tmp_path / "init")

    # float32 HF checkpoints: the master weights.
    log = run(fixture, init, tmp_path / "f32", seq, "--save-format", "hf", "--save-dtype", "float32")
    ckpt1 = tmp_path / "f32" / "checkpoint-1"
    assert json.loads((ckpt1 / "config.json").read_text())["dtype"] == "float32"
    assert (ckpt1 / "model.safetensors").exists() and not (ckpt1 / "model.safetensors.index.json").exists()
    model = load(ckpt1)
    with torch.no_grad():
        logits32 = model(window2).logits[0]
    loss = torch.nn.functional.cross_entropy(logits32[:-1], window2[0, 1:]).item()
    assert log[1]["step"] == 2
    rel = abs(loss - log[1]["loss"]) / abs(loss)
    print(f"{fixture.name}: step 2 loss {log[1]['loss']!r} (oomb-train, float32), {loss!r} (transformers, float64 "
          f"from checkpoint-1): relative difference {rel:.2e}")
    assert rel <= LOSS_RTOL

    # The tokenizer and generation config came along.
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (ckpt1 / name).read_bytes() == (init / name).read_bytes(), name
    # (AutoTokenizer would pick the family's tokenizer class from config.json's model_type, which this
    # word-level stand-in is not; the fast tokenizer reads tokenizer.json as it is.)
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(ckpt1)
    assert tok("w3 w5")["input_ids"] == [3, 5]
    assert transformers.GenerationConfig.from_pretrained(ckpt1).max_new_tokens == 7

    # bfloat16, in shards of at most 8 KB, and an --export of the last step beside the checkpoints.
    run(fixture, init, tmp_path / "bf16", seq, "--save-format", "hf", "--save-shard-size", "8KB", "--export",
        str(tmp_path / "export"))
    for bf16_dir, f32_dir in ((tmp_path / "bf16" / "checkpoint-1", ckpt1),
                              (tmp_path / "export", tmp_path / "f32" / "checkpoint-2")):
        assert json.loads((bf16_dir / "config.json").read_text())["dtype"] == "bfloat16"
        index = json.loads((bf16_dir / "model.safetensors.index.json").read_text())
        w16, w32 = weights(bf16_dir), weights(f32_dir)
        assert sorted(index["weight_map"]) == sorted(w16) == sorted(w32)
        assert len(set(index["weight_map"].values())) > 1
        assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in w16.values())
        for name, t in w16.items():
            assert t.dtype == torch.bfloat16 and w32[name].dtype == torch.float32, name
            assert torch.equal(t.view(torch.int16), w32[name].to(torch.bfloat16).view(torch.int16)), name
        with torch.no_grad():
            a = load(bf16_dir)(window2).logits[0]
            b = load(f32_dir)(window2).logits[0]
        diff = (torch.linalg.norm(a - b) / torch.linalg.norm(b)).item()
        print(f"{fixture.name}: {bf16_dir.name} bfloat16 vs float32 logits: norm-wise difference {diff:.2e}, largest "
              f"{((a - b).abs().max() / b.abs().max()).item():.2e} of the largest logit")
        assert diff <= BF16_LOGIT_TOL
    assert not (tmp_path / "export" / "optimizer.safetensors").exists()
    assert (tmp_path / "export" / "tokenizer.json").exists()


def test_fixtures_are_there():
    assert FIXTURE_DIRS, f"no HF fixture under {FIXTURES}"
