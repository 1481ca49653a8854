# SPDX-License-Identifier: Apache-2.0
"""Hugging Face's Trainer, chunk-recurrently: oomb.hf.ChunkRecurrentTrainer over a tiny Qwen2 on
random 1,024-token rows (CPU), with gradient accumulation, clipping, a cosine schedule and a
checkpoint; --lora trains PEFT LoRA adapters over the frozen base instead; --packed trains documents
of 64-256 tokens packed four to a row by transformers' DataCollatorWithFlattening, each document
attending only itself.
python examples/train_trainer.py [output_dir] [--lora] [--packed]"""
import sys
import tempfile

import torch
import transformers

from oomb.hf import ChunkRecurrentTrainer

out_dir = next((a for a in sys.argv[1:] if not a.startswith("--")), None) or tempfile.mkdtemp()


def packed_documents(vocab):
    # snippet-begin: packed
    # Documents of 64-256 tokens, four to a row: the collator concatenates them, puts -100 at each
    # document's first label and restarts position_ids at 0; the driver takes the position_ids as
    # per-document attention and positions, so each document trains as if it were alone.
    lengths = torch.randint(64, 257, (32,)).tolist()
    rows = [{"input_ids": torch.randint(0, vocab, (n,)).tolist()} for n in lengths]
    return rows, transformers.DataCollatorWithFlattening(), 4  # rows, the collator, documents per row
    # snippet-end: packed


# snippet-begin: trainer
tokens = 1024
config = transformers.Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=tokens)
model = transformers.Qwen2ForCausalLM(config)
if "--lora" in sys.argv:
    import peft  # lora_dropout is replayed: stage 2 draws stage 1's masks
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.05))
rows = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, config.vocab_size, (8, tokens))]
collator, batch = None, 1
if "--packed" in sys.argv:
    rows, collator, batch = packed_documents(config.vocab_size)  # four documents a row
args = transformers.TrainingArguments(output_dir=out_dir, per_device_train_batch_size=batch,
                                      gradient_accumulation_steps=2, max_steps=4, learning_rate=3e-3,
                                      lr_scheduler_type="cosine", warmup_steps=1, max_grad_norm=1.0,
                                      logging_steps=1, save_steps=2, report_to=[], use_cpu=True)
trainer = ChunkRecurrentTrainer(model=model, args=args, train_dataset=rows, data_collator=collator,
                                chunk=256, page=128, max_tokens=tokens)  # the driver's plan, as ChunkRecurrent
trainer.train()  # training_step runs forward_backward; the rest (clipping, schedule, checkpoints) is Trainer's
# snippet-end: trainer
print("checkpoints in", out_dir)
