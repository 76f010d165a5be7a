#!/usr/bin/env python
"""Train the paper's Transformer: `accelerate launch scripts/train.py configs/quickstart.yaml` (or `python ...`; on a CPU,
`accelerate launch --cpu --num_processes 1`, or accelerate gives torch one thread).

The first argument may be a YAML/JSON recipe (see configs/); any `--flag value` after it overrides the recipe.
All of `Seq2SeqTrainingArguments` is accepted, plus the data/model flags of transformers' run_translation.py
example and ours (--preset, --config_overrides, --max_tokens_per_batch, --tokens_per_update, --synthetic_task,
--average_last_checkpoints, --lr_factor, --save_every_minutes). `--preset` sets the model and the training values
of its Table 3 row (label smoothing, max_steps); a flag or recipe key the user gives wins. `--help` lists everything.
The same command is installed as `vaswani-train` (`vaswani_transformer.train.main`).
"""

from vaswani_transformer.train import main

if __name__ == "__main__":
    main()
