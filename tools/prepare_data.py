#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Turns JSONL text and chat into an oomb-train token file (OOMBTOKS version 2, docs/formats.md).

    python3 tools/prepare_data.py --tokenizer MODEL_DIR --input corpus.jsonl [--input chat.jsonl ...]
                                  --output train.tokens [--eos TOKEN | --no-eos] [--quiet]

MODEL_DIR is the model folder (or any folder with its tokenizer files): the tokenizer is the
model's own, loaded with transformers' AutoTokenizer (offline: nothing is downloaded). Each input
line is one document, a JSON object with either

  {"text": "..."}                       continued pre-training: every target counts
  {"messages": [{"role": ..., "content": "..."}, ...]}
                                        a chat, rendered by the tokenizer's chat template; only the
                                        assistant messages' tokens count in the loss

Other keys of a record (ids, sources) are ignored; blank lines are skipped; a record whose text is
empty, or a chat without an assistant message, adds nothing to train on and is skipped (counted in
the summary). Anything else — a line that is not UTF-8 or not JSON, a record with neither or both
of "text" and "messages", a message without a string "role" and "content", a chat template that
fails — stops the script with the file and line number, and nothing is written.

Special tokens, per document (the rule docs/trainer.md states):
  * text: the text encoded with the tokenizer's special tokens — a BOS where its config puts one
    (tokenizer_config.json's add_bos_token, or tokenizer.json's post-processor, as transformers
    applies them) —, then the EOS token appended unless the ids already end with it. The EOS is
    the tokenizer's eos_token; --eos TOKEN names another (e.g. <|endoftext|> for an Instruct
    model whose eos_token is its end of turn), --no-eos appends none.
  * chat: the template's rendering encoded without special tokens (templates write their own BOS,
    as Llama 3's does), with the tokenizer's BOS put in front when its config adds one and the
    rendering does not start with it. No EOS is appended: the template's end-of-turn token ends the
    assistant's turn, and it counts in the loss (the model must learn to stop).

Which chat tokens count: stock Qwen2.5 and Llama 3 templates mark no generation spans, so each
assistant message is found by rendering prefixes of the conversation and diffing them: message i's
span runs from the end of the rendering of messages [0, i) with the generation prompt (which ends
with the assistant header) to the end of the rendering of messages [0, i] (its content and the
end-of-turn token), less whitespace at its end (ChatML's newline after <|im_end|>). A token counts
when its first character lies in a span. A template whose renderings of prefixes are not prefixes
of the whole conversation's (one that rewrites earlier turns, e.g. drops a reasoning block) is
refused, naming the line: the spans could not be found.

Output: version 2 with every document's start, and the loss mask when any chat was read (a text-only
corpus gets none: every target counts). The vocabulary size in the header is len(tokenizer). The
file is written as OUTPUT.tmp-* beside OUTPUT (with two more temporaries for the starts and the
mask) and renamed into place at the end; on any error the temporaries are removed and OUTPUT is
untouched. Input is streamed (one batch of lines at a time), so the size of a corpus is bounded by
the disk, not memory. A progress bar over the input bytes goes to stderr when it is a terminal
(tqdm, which transformers already depends on); the summary line goes to stderr at the end.
"""
import argparse
import array
import json
import os
import struct
import sys
import tempfile

MAGIC = b"OOMBTOKS"
VERSION = 2
HEADER_SIZE = 64
FLAG_MASK = 1
BATCH_LINES = 1024


class InputError(Exception):
    """A malformed line or a record the script cannot turn into tokens (with file and line)."""


def header_bytes(tokens, vocab, documents, mask):
    h = MAGIC + struct.pack("<IIQII", VERSION, HEADER_SIZE, tokens, vocab, FLAG_MASK if mask else 0)
    h += struct.pack("<Q", documents)
    return h + b"\0" * (HEADER_SIZE - len(h))


class TokenFileWriter:
    """Streams documents into a version 2 token file: the ids into OUTPUT.tmp-*, the starts and
    the mask into temporaries of their own; commit() joins them and renames the result into place,
    close() without commit() removes everything."""

    def __init__(self, path, vocab):
        self.path = os.path.abspath(path)
        self.vocab = vocab
        folder, name = os.path.split(self.path)
        self.files = []
        for suffix in ("", ".starts", ".mask"):
            fd, tmp = tempfile.mkstemp(prefix=name + ".tmp-", suffix=suffix, dir=folder)
            self.files.append((os.fdopen(fd, "w+b"), tmp))
        (self.out, _), (self.starts, _), (self.mask, _) = self.files
        self.out.write(b"\0" * HEADER_SIZE)  # the header is written last, when the counts are known
        self.tokens = 0
        self.documents = 0
        self.committed = False

    def add(self, ids, mask):
        """One document: its ids and one 0/1 byte per id."""
        assert len(ids) == len(mask) and len(ids) > 0
        a = array.array("I", ids)
        if sys.byteorder != "little":
            a.byteswap()
        self.out.write(a.tobytes())
        self.starts.write(struct.pack("<Q", self.tokens))
        self.mask.write(bytes(mask))
        self.tokens += len(ids)
        self.documents += 1

    def commit(self, with_mask):
        if self.tokens % 2:
            self.out.write(b"\0" * 4)  # the starts begin 8-byte aligned
        for f, keep in ((self.starts, True), (self.mask, with_mask)):
            if not keep:
                continue
            f.flush()
            f.seek(0)
            while True:
                block = f.read(1 << 24)
                if not block:
                    break
                self.out.write(block)
        self.out.seek(0)
        self.out.write(header_bytes(self.tokens, self.vocab, self.documents, with_mask))
        self.out.flush()
        os.fsync(self.out.fileno())
        os.chmod(self.files[0][1], 0o666 & ~current_umask())
        os.replace(self.files[0][1], self.path)
        self.committed = True
        fd = os.open(os.path.dirname(self.path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self):
        for i, (f, tmp) in enumerate(self.files):
            f.close()
            if i > 0 or not self.committed:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass


def current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


class Preparer:
    def __init__(self, tokenizer, eos):
        self.tok = tokenizer
        self.eos_id = None
        if eos is not None:
            ids = tokenizer.convert_tokens_to_ids([eos])
            if not ids or ids[0] is None or ids[0] == tokenizer.unk_token_id and eos != tokenizer.unk_token:
                raise InputError(f"--eos {eos!r} is not a token of the tokenizer")
            self.eos_id = ids[0]
        # What encoding with special tokens adds around a text: the BOS (and EOS) the config asks for.
        probe = "a"
        plain = tokenizer(probe, add_special_tokens=False)["input_ids"]
        special = tokenizer(probe, add_special_tokens=True)["input_ids"]
        k = next((i for i in range(len(special) - len(plain) + 1) if special[i:i + len(plain)] == plain), 0)
        self.prefix = list(special[:k])
        self.vocab = len(tokenizer)
        self.stats = {"text": 0, "chat": 0, "empty": 0, "no_assistant": 0, "chat_tokens": 0, "assistant_tokens": 0}

    def text(self, texts):
        """Documents of a batch of texts: (ids, mask) each."""
        out = []
        for ids in self.tok(texts, add_special_tokens=True)["input_ids"]:
            ids = list(ids)
            if self.eos_id is not None and (not ids or ids[-1] != self.eos_id):
                ids.append(self.eos_id)
            out.append((ids, [1] * len(ids)))
            self.stats["text"] += 1
        return out

    def render(self, messages, where, generation):
        try:
            r = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
        except Exception as e:  # jinja errors, a template refusing a role order, ...
            raise InputError(f"{where}: the chat template failed on the first {len(messages)} messages: "
                             f"{type(e).__name__}: {e}") from None
        if not isinstance(r, str):
            raise InputError(f"{where}: the chat template rendered {type(r).__name__}, not text")
        return r

    def spans(self, messages, where):
        """The full rendering and the character spans of its assistant messages."""
        full = self.render(messages, where, False)
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before = self.render(messages[:i], where, True) if i > 0 else ""
            after = self.render(messages[:i + 1], where, False)
            if not (full.startswith(before) and full.startswith(after) and after.startswith(before)):
                raise InputError(f"{where}: the chat template does not render this conversation prefix by prefix "
                                 f"(the rendering of its first {i if not full.startswith(before) else i + 1} "
                                 "messages is not the start of the whole), so the assistant turns cannot be found")
            a, b = len(before), len(after.rstrip())
            if spans and a < spans[-1][1]:
                raise InputError(f"{where}: the chat template's assistant turns overlap (message {i})")
            if b > a:
                spans.append((a, b))
        return full, spans

    def chat(self, chats):
        """Documents of a batch of (messages, where) chats."""
        rendered = [self.spans(m, where) for m, where in chats]
        enc = self.tok([r[0] for r in rendered], add_special_tokens=False, return_offsets_mapping=True)
        out = []
        for (full, spans), ids, offsets in zip(rendered, enc["input_ids"], enc["offset_mapping"]):
            ids, mask, k = list(ids), [], 0
            for start, _ in offsets:
                while k < len(spans) and start >= spans[k][1]:
                    k += 1
                mask.append(1 if k < len(spans) and spans[k][0] <= start else 0)
            if self.prefix and ids[:len(self.prefix)] != self.prefix:
                ids, mask = self.prefix + ids, [0] * len(self.prefix) + mask
            self.stats["chat"] += 1
            self.stats["chat_tokens"] += len(ids)
            self.stats["assistant_tokens"] += sum(mask)
            out.append((ids, mask))
        return out


def parse_record(line, where):
    """("text", str) or ("chat", messages) or None (skip) for one line; InputError when malformed."""
    try:
        s = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{where}: not UTF-8 ({e})") from None
    if not s.strip():
        return None
    try:
        r = json.loads(s)
    except json.JSONDecodeError as e:
        raise InputError(f"{where}: not JSON ({e})") from None
    if not isinstance(r, dict):
        raise InputError(f"{where}: a record must be a JSON object with \"text\" or \"messages\", got {type(r).__name__}")
    has_text, has_messages = "text" in r, "messages" in r
    if has_text == has_messages:
        raise InputError(f"{where}: a record needs exactly one of \"text\" and \"messages\"" +
                         (" (it has both)" if has_text else f" (its keys: {', '.join(sorted(r)) or 'none'})"))
    if has_text:
        if not isinstance(r["text"], str):
            raise InputError(f"{where}: \"text\" must be a string, got {type(r['text']).__name__}")
        return ("text", r["text"])
    messages = r["messages"]
    if not isinstance(messages, list) or not messages:
        raise InputError(f"{where}: \"messages\" must be a non-empty list of {{\"role\", \"content\"}} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InputError(f"{where}: message {i} must be an object, got {type(m).__name__}")
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):
                raise InputError(f"{where}: message {i} needs a string \"{key}\"" +
                                 (f", got {type(m[key]).__name__}" if key in m else ""))
    return ("chat", messages)


def read_batches(paths):
    """Yields lists of (kind, value, where) records, BATCH_LINES lines at a time, and the bytes read."""
    batch, done = [], 0
    for path in paths:
        with open(path, "rb") as f:
            for n, line in enumerate(f, 1):
                done += len(line)
                r = parse_record(line, f"{path}:{n}")
                if r is not None:
                    batch.append((r[0], r[1], f"{path}:{n}"))
                if len(batch) >= BATCH_LINES:
                    yield batch, done
                    batch, done = [], 0
    yield batch, done


def progress_bar(total, quiet):
    class NoBar:
        def update(self, n):
            pass

        def close(self):
            pass

    if quiet:
        return NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return NoBar()
    return tqdm(total=total, unit="B", unit_scale=True, desc="prepare_data", file=sys.stderr, disable=None)


def prepare(args):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for p in args.input:
        if not os.path.isfile(p):
            raise InputError(f"--input {p}: no such file")
    if not os.path.isdir(args.tokenizer):
        raise InputError(f"--tokenizer {args.tokenizer}: not a folder (give the model folder holding its tokenizer files)")
    from transformers import AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(args.tokenizer)
    except Exception as e:
        raise InputError(f"--tokenizer {args.tokenizer}: cannot load a tokenizer: {type(e).__name__}: {e}") from None
    if not getattr(tok, "is_fast", False):
        raise InputError(f"--tokenizer {args.tokenizer}: a fast (tokenizers) tokenizer is needed for the chat masks' "
                         "character offsets")
    eos = None if args.no_eos else (args.eos or tok.eos_token)
    if eos is None and not args.no_eos:
        raise InputError(f"--tokenizer {args.tokenizer}: the tokenizer has no eos_token; give --eos TOKEN or --no-eos")
    prep = Preparer(tok, eos)
    if prep.vocab >= 2 ** 31:
        raise InputError(f"the tokenizer's {prep.vocab} tokens do not fit a token file's int32 ids")
    out_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(out_dir):
        raise InputError(f"--output {args.output}: the folder {out_dir} does not exist")
    bar = progress_bar(sum(os.path.getsize(p) for p in args.input), args.quiet)
    writer = TokenFileWriter(args.output, prep.vocab)
    try:
        for batch, read in read_batches(args.input):
            texts = [(v, w) for k, v, w in batch if k == "text" and v]
            chats = [(v, w) for k, v, w in batch if k == "chat" and any(m["role"] == "assistant" for m in v)]
            prep.stats["empty"] += sum(1 for k, v, _ in batch if k == "text" and not v)
            prep.stats["no_assistant"] += sum(1 for k, v, _ in batch if k == "chat") - len(chats)
            docs = dict()  # in input order
            if chats:
                for (_, w), d in zip(chats, prep.chat(chats)):
                    docs[w] = d
            if texts:
                for (_, w), d in zip(texts, prep.text([t for t, _ in texts])):
                    docs[w] = d
            for _, _, w in batch:
                if w in docs:
                    ids, mask = docs[w]
                    if ids and max(ids) >= prep.vocab:
                        raise InputError(f"{w}: token id {max(ids)} is outside the tokenizer's {prep.vocab} tokens")
                    if ids:
                        writer.add(ids, mask)
            bar.update(read)
        bar.close()
        if writer.documents == 0:
            raise InputError("no document to write: every record was empty or had no assistant message")
        writer.commit(with_mask=prep.stats["chat"] > 0)
    finally:
        writer.close()
    s = prep.stats
    skipped = []
    if s["empty"]:
        skipped.append(f"{s['empty']} empty texts")
    if s["no_assistant"]:
        skipped.append(f"{s['no_assistant']} chats without an assistant message")
    share = f", {100.0 * s['assistant_tokens'] / s['chat_tokens']:.1f}% of the chats' tokens assistant" if s["chat"] else ""
    print(f"prepare_data: {args.output}: {writer.tokens} tokens in {writer.documents} documents ({s['text']} texts, "
          f"{s['chat']} chats{share}), vocabulary {prep.vocab}, "
          f"{'a loss mask' if s['chat'] else 'no loss mask'}, eos {eos!r}" +
          (f"; skipped {', '.join(skipped)}" if skipped else ""), file=sys.stderr)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="docs/trainer.md (Data) and docs/formats.md (token files) say more.")
    ap.add_argument("--tokenizer", required=True, metavar="DIR", help="the model folder (its tokenizer files)")
    ap.add_argument("--input", required=True, action="append", metavar="JSONL",
                    help="JSONL input, one record a line; repeat for more files (read in order)")
    ap.add_argument("--output", required=True, metavar="FILE", help="the token file to write (replaced atomically)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--eos", metavar="TOKEN", help="the token appended to every text document (default: eos_token)")
    g.add_argument("--no-eos", action="store_true", help="append no token to text documents")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    try:
        return prepare(args)
    except InputError as e:
        print(f"prepare_data: {e} (nothing written)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
