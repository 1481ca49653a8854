# SPDX-License-Identifier: Apache-2.0
"""tools/prepare_data.py: JSONL text and chat into a version 2 token file, read back three ways.

Two tiny tokenizers are trained here with `tokenizers` (byte-level BPE over a few sentences, no
download): a Qwen2.5-like one (ChatML template with a default system prompt, no BOS, eos
<|endoftext|>) and a Llama-3-like one (add_bos_token, a template that writes its own BOS and trims
contents, eos <|eot_id|>); neither template marks generation spans. Checked:
  * text: each document is the tokenizer's encoding with its special tokens, then the EOS (BOS
    exactly when the config adds one); a text-only file has no loss mask; --eos / --no-eos;
  * chat: the ids decode to the template's rendering; the counted tokens are exactly each
    assistant message's content and its end-of-turn token — not the header before it, not the
    newline after it, not the system or user turns; one BOS, never two;
  * the file read back by a parser written here from docs/formats.md, by the trainer's C++ reader
    (make-tokens --inspect --dump) and by oomb-train, which trains a packed, masked run on it;
  * a malformed line stops the script naming its file and line, writing nothing (an existing output
    stays as it was, no temporary is left); a template that rewrites earlier turns is refused.
The script runs in this process (its main(), so transformers is imported once: 6 s instead of 60)
and once as a command. Run by ctest (tests/trainer/CMakeLists.txt, test trainer_prepare_data, label cpu) in the .venv of
tools/setup.sh; OOMB_TRAIN and OOMB_MAKE_TOKENS name the binaries. Without them it fails.
"""
import contextlib
import io
import json
import os
import pathlib
import struct
import subprocess
import sys
import types

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SCRIPT = ROOT / "tools" / "prepare_data.py"

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Pack my box with five dozen liquor jugs.",
    "How vexingly quick daft zebras jump!",
    "Sphinx of black quartz, judge my vow.",
    "You are a helpful assistant. What is the capital of France? Paris is the capital of France.",
    "def add(a, b):\n    return a + b\n",
    "1 2 3 4 5 6 7 8 9 10 and numbers 42, 1024 and 65536.",
] * 20

QWEN_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if message.role != 'system' or not loop.first %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
UNSTABLE_TEMPLATE = (  # says how many turns there are at the top: no prefix renders as the start of the whole
    "{{- '<|im_start|>turns ' + (messages|length|string) + '<|im_end|>\\n' }}"
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"},
     {"role": "assistant", "content": "Paris is the capital of France."}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Add 2 and 3."},
     {"role": "assistant", "content": "5"},
     {"role": "user", "content": "And 40 and 2?"},
     {"role": "assistant", "content": " 42, the answer. "}],
]


def make_tokenizer(folder, kind, template=None):
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers
    import transformers
    if kind == "qwen":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    else:
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    if kind == "qwen":
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                                    pad_token="<|endoftext|>")
        fast.chat_template = template or QWEN_TEMPLATE
    else:
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                                                    eos_token="<|eot_id|>", add_bos_token=True)
        fast.chat_template = template or LLAMA_TEMPLATE
    fast.save_pretrained(folder)
    return transformers.AutoTokenizer.from_pretrained(folder)


def write_jsonl(path, records, raw_lines=()):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        for line in raw_lines:
            f.write(line + "\n")


sys.path.insert(0, str(SCRIPT.parent))
import prepare_data  # noqa: E402  (tools/prepare_data.py, run in this process: transformers is imported once)

sys.path.pop(0)


def prepare(tokenizer_dir, inputs, output, *flags, check=True, subprocess_run=False):
    """Runs prepare_data.py's main() (or the script in a subprocess), returning (returncode, stdout, stderr)."""
    args = ["--tokenizer", str(tokenizer_dir), "--output", str(output), "--quiet", *flags]
    for i in inputs:
        args += ["--input", str(i)]
    if subprocess_run:
        r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                           env={**os.environ, "HF_HUB_OFFLINE": "1"})
        result = types.SimpleNamespace(returncode=r.returncode, stdout=r.stdout, stderr=r.stderr)
    else:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = prepare_data.main(args)
        result = types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())
    if check:
        assert result.returncode == 0, f"prepare_data {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
    return result


def read_token_file(path):
    """A version 2 token file, parsed as docs/formats.md lays it out (every field checked)."""
    b = pathlib.Path(path).read_bytes()
    assert b[:8] == b"OOMBTOKS"
    version, header, n, vocab, flags, docs = struct.unpack_from("<IIQIIQ", b, 8)
    assert (version, header) == (2, 64)
    assert b[40:64] == b"\0" * 24
    assert flags in (0, 1)
    ids = list(struct.unpack_from(f"<{n}I", b, 64))
    at = 64 + 4 * n
    if n % 2:
        assert b[at:at + 4] == b"\0" * 4
        at += 4
    starts = list(struct.unpack_from(f"<{docs}Q", b, at))
    at += 8 * docs
    mask = list(b[at:at + n]) if flags & 1 else None
    assert len(b) == at + (n if flags & 1 else 0)
    assert starts[0] == 0 and all(x < y for x, y in zip(starts, starts[1:])) and starts[-1] < n
    assert all(t < vocab for t in ids)
    documents = [ids[s:e] for s, e in zip(starts, starts[1:] + [n])]
    masks = [mask[s:e] for s, e in zip(starts, starts[1:] + [n])] if mask is not None else None
    return {"vocab": vocab, "ids": ids, "starts": starts, "mask": mask, "documents": documents, "masks": masks}


def counted_runs(tok, ids, mask):
    """The counted tokens of a document as text: one string per maximal run of mask 1."""
    runs, cur = [], []
    for t, m in zip(ids + [None], mask + [0]):
        if m:
            cur.append(t)
        elif cur:
            runs.append(tok.decode(cur, skip_special_tokens=False))
            cur = []
    return runs


def cpp_inspect(path):
    exe = os.environ.get("OOMB_MAKE_TOKENS", "")
    assert exe and os.access(exe, os.X_OK), f"OOMB_MAKE_TOKENS must name the make-tokens binary (got {exe!r})"
    r = subprocess.run([exe, "--inspect", str(path), "--dump"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen-tokenizer")
    return d, make_tokenizer(d, "qwen")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama-tokenizer")
    return d, make_tokenizer(d, "llama")


def test_text_documents_are_the_tokenizers_encoding_then_eos(qwen, llama, tmp_path):
    texts = ["The quick brown fox.", "Pack my box with five dozen liquor jugs.", "zebras 42"]
    write_jsonl(tmp_path / "a.jsonl", [{"text": t, "id": i} for i, t in enumerate(texts[:2])], ["", "   "])
    write_jsonl(tmp_path / "b.jsonl", [{"text": texts[2]}, {"text": ""}])
    for (folder, tok), bos in ((qwen, False), (llama, True)):
        out = tmp_path / f"{folder.name}.tokens"
        r = prepare(folder, [tmp_path / "a.jsonl", tmp_path / "b.jsonl"], out)
        assert "3 documents (3 texts, 0 chats)" in r.stderr and "no loss mask" in r.stderr
        assert "skipped 1 empty texts" in r.stderr
        f = read_token_file(out)
        assert f["mask"] is None  # text only: every target counts
        assert f["vocab"] == len(tok)
        for doc, text in zip(f["documents"], texts):  # in input order, files in the order given
            assert doc == tok(text, add_special_tokens=True)["input_ids"] + [tok.eos_token_id]
            assert (doc[0] == tok.bos_token_id) == bos
            assert doc.count(tok.eos_token_id) == 1
            assert tok.decode(doc, skip_special_tokens=True) == text
        # --eos names another token; --no-eos appends none.
        prepare(folder, [tmp_path / "b.jsonl"], out, "--no-eos")
        assert read_token_file(out)["documents"] == [tok(texts[2], add_special_tokens=True)["input_ids"]]
    folder, tok = qwen
    prepare(folder, [tmp_path / "b.jsonl"], tmp_path / "e.tokens", "--eos", "<|im_end|>")
    assert read_token_file(tmp_path / "e.tokens")["documents"][0][-1] == tok.convert_tokens_to_ids("<|im_end|>")
    r = prepare(folder, [tmp_path / "b.jsonl"], tmp_path / "x.tokens", "--eos", "<|nope|>", check=False)
    assert r.returncode == 1 and "--eos '<|nope|>' is not a token" in r.stderr


@pytest.mark.parametrize("kind", ["qwen", "llama"])
def test_chat_masks_count_the_assistant_tokens_only(kind, qwen, llama, tmp_path):
    folder, tok = qwen if kind == "qwen" else llama
    end = "<|im_end|>" if kind == "qwen" else "<|eot_id|>"
    write_jsonl(tmp_path / "chat.jsonl", [{"messages": m} for m in CHATS] +
                [{"messages": [{"role": "user", "content": "no answer here"}]}, {"text": "The quick brown fox."}])
    out = tmp_path / "chat.tokens"
    r = prepare(folder, [tmp_path / "chat.jsonl"], out)
    assert "3 documents (1 texts, 2 chats" in r.stderr and "a loss mask" in r.stderr
    assert "skipped 1 chats without an assistant message" in r.stderr
    f = read_token_file(out)
    assert f["mask"] is not None
    for messages, ids, mask in zip(CHATS, f["documents"], f["masks"]):
        rendered = tok.apply_chat_template(messages, tokenize=False)
        assert tok.decode(ids, skip_special_tokens=False) == rendered  # the template's text, token for token
        contents = [m["content"] if kind == "qwen" else m["content"].strip() for m in messages if m["role"] == "assistant"]
        # The counted runs are the assistant contents with their end-of-turn token: not the header
        # before them, not the newline after <|im_end|>, nothing of the system or user turns.
        assert counted_runs(tok, ids, mask) == [c + end for c in contents]
        assert sum(mask) == sum(len(tok(c + end, add_special_tokens=False)["input_ids"]) for c in contents)
        if kind == "llama":
            assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1  # the template's BOS, not two
        else:
            assert tok.bos_token_id is None or tok.bos_token_id not in ids
    # The text document of a file with chats: every target counts.
    assert f["masks"][2] == [1] * len(f["documents"][2])


def test_cpp_reader_and_oomb_train_read_the_file(qwen, tmp_path):
    folder, tok = qwen
    records = [{"messages": m} for m in CHATS] * 6 + [{"text": t} for t in CORPUS[:7]] * 3
    write_jsonl(tmp_path / "mix.jsonl", records)
    out = tmp_path / "mix.tokens"
    prepare(folder, [tmp_path / "mix.jsonl"], out, subprocess_run=True)  # as a command, once
    f = read_token_file(out)
    j = cpp_inspect(out)  # the trainer's reader: every field and id checked
    assert j["version"] == 2 and j["tokens"] == len(f["ids"]) and j["vocab_size"] == len(tok)
    assert j["documents"] == len(records) and j["mask"] is True and j["mask_ones"] == sum(f["mask"])
    assert j["ids"] == f["ids"] and j["document_starts"] == f["starts"] and j["loss_mask"] == f["mask"]

    # oomb-train on it: a packed, masked run of a tiny model over the tokenizer's vocabulary.
    exe = os.environ.get("OOMB_TRAIN", "")
    assert exe and os.access(exe, os.X_OK), f"OOMB_TRAIN must name the oomb-train binary (got {exe!r})"
    config = json.loads((ROOT / "configs" / "tiny.json").read_text())
    config["vocab_size"] = len(tok)
    (tmp_path / "config.json").write_text(json.dumps(config))
    for packing in ("documents", "none"):
        run = tmp_path / f"run-{packing}"
        cmd = [exe, "--config", str(tmp_path / "config.json"), "--data", str(out), "--packing", packing, "--seq-len", "256",
               "--chunk", "64", "--steps", "3", "--lr", "3e-3", "--out", str(run), "--quiet"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, f"{' '.join(cmd)}:\n{r.stdout}\n{r.stderr}"
        log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        assert len(log) == 3 and all(x["loss_kind"] == "mask" for x in log)
        assert "masked loss" in r.stdout
        state = json.loads((run / "checkpoint" / "trainer_state.json").read_text())
        assert state["extra"]["packing"] == packing
        if packing == "documents":
            assert "attention and positions per document" in r.stdout
            assert "packed by documents" in r.stdout
            assert all(x["padding_tokens"] >= 0 for x in log)
            assert state["data_position"] > 3  # units (documents) taken, several per sequence
        else:
            assert state["data_position"] == 3 * 256


BAD_LINES = [
    ("{not json", "not JSON"),
    ("[1, 2]", "a record must be a JSON object"),
    ('{"id": 3}', 'needs exactly one of "text" and "messages" (its keys: id)'),
    ('{"text": "a", "messages": []}', "(it has both)"),
    ('{"text": 5}', '"text" must be a string, got int'),
    ('{"messages": "hi"}', '"messages" must be a non-empty list'),
    ('{"messages": [{"role": "user"}]}', 'message 0 needs a string "content"'),
    ('{"messages": [{"role": "user", "content": "q"}, {"role": 1, "content": "a"}]}', 'message 1 needs a string "role", got int'),
    ('{"messages": [{"role": "user", "content": [{"type": "text"}]}]}', 'message 0 needs a string "content", got list'),
]


@pytest.mark.parametrize("line,message", BAD_LINES)
def test_a_malformed_line_is_refused_by_line_number_and_nothing_is_written(qwen, tmp_path, line, message):
    folder, _ = qwen
    write_jsonl(tmp_path / "bad.jsonl", [{"text": "fine"}, {"messages": CHATS[0]}], [line, '{"text": "after"}'])
    out = tmp_path / "out.tokens"
    out.write_bytes(b"the previous file")
    r = prepare(folder, [tmp_path / "bad.jsonl"], out, check=False)
    assert r.returncode == 1
    assert f"bad.jsonl:3: " in r.stderr and message in r.stderr and "nothing written" in r.stderr, r.stderr
    assert out.read_bytes() == b"the previous file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "out.tokens"]  # no temporary left


def test_not_utf8_and_a_template_that_rewrites_earlier_turns_are_refused(qwen, tmp_path):
    folder, _ = qwen
    (tmp_path / "bin.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "\xff"}\n')
    r = prepare(folder, [tmp_path / "bin.jsonl"], tmp_path / "o.tokens", check=False)
    assert r.returncode == 1 and "bin.jsonl:2: not UTF-8" in r.stderr
    unstable = tmp_path / "unstable"
    make_tokenizer(unstable, "qwen", UNSTABLE_TEMPLATE)
    write_jsonl(tmp_path / "c.jsonl", [{"text": "ok"}, {"messages": CHATS[1]}])
    r = prepare(unstable, [tmp_path / "c.jsonl"], tmp_path / "o.tokens", check=False)
    assert r.returncode == 1
    assert "c.jsonl:2: the chat template does not render this conversation prefix by prefix" in r.stderr, r.stderr
    assert not (tmp_path / "o.tokens").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin.jsonl", "c.jsonl", "unstable"]


def test_batches_stream_the_input_the_same_whatever_their_size(qwen, tmp_path, monkeypatch):
    folder, _ = qwen
    records = [{"messages": m} for m in CHATS] * 4 + [{"text": t} for t in CORPUS[:7]] + [{"text": ""}]
    write_jsonl(tmp_path / "mix.jsonl", records)
    prepare(folder, [tmp_path / "mix.jsonl"], tmp_path / "whole.tokens")
    monkeypatch.setattr(prepare_data, "BATCH_LINES", 3)  # batches that cut chats and texts apart
    prepare(folder, [tmp_path / "mix.jsonl"], tmp_path / "batched.tokens")
    assert (tmp_path / "batched.tokens").read_bytes() == (tmp_path / "whole.tokens").read_bytes()
