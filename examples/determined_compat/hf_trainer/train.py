"""Hugging Face's ``Trainer`` on det with ``determined.transformers.DetCallback``, as in
Determined 0.38's ``hf_trainer_api`` examples, on a model small enough for a CPU: a BERT
classifier randomly initialised from a ``BertConfig`` (no hub download) over random token ids
(no tokenizer, no data set download), learning the parity of each sequence's first token.

The callback reports training and validation metrics, stores each HF checkpoint in det, stops
when det pauses the trial and resumes from det's latest checkpoint (``global_step`` goes on).
"""

import logging
import tempfile
from collections.abc import Callable, Sequence

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

import determined as det
from determined.transformers import DetCallback

VOCAB = 64
SEQ_LEN = 8


class RandomTokens(torch.utils.data.Dataset):
    """``size`` sequences of random token ids, labelled by their first token's parity."""

    def __init__(self, size: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (size, SEQ_LEN), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i, 0] % 2}


def tiny_bert() -> BertForSequenceClassification:
    return BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=SEQ_LEN, num_labels=2))


def main(more_callbacks: Callable[[det.core.Context], Sequence[TrainerCallback]] = lambda _: ()
         ) -> None:
    """Train; ``more_callbacks(core_context)``: callbacks to add after ``DetCallback``."""
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    hparams = info.trial.hparams
    torch.manual_seed(info.trial.trial_seed)
    args = TrainingArguments(
        # A fresh directory per run: a resumed run starts from det's checkpoint alone.
        output_dir=tempfile.mkdtemp(prefix="hf-trainer-"),
        max_steps=hparams["max_steps"], learning_rate=hparams["learning_rate"],
        per_device_train_batch_size=8, per_device_eval_batch_size=16,
        logging_steps=2, eval_strategy="steps", eval_steps=4, save_steps=4,
        report_to=[], use_cpu=True, disable_tqdm=True, seed=info.trial.trial_seed)
    with det.core.init() as core_context:
        callback = DetCallback(core_context, args, user_data={"model": "tiny-bert"})
        trainer = Trainer(model=tiny_bert(), args=args, train_dataset=RandomTokens(256, 0),
                          eval_dataset=RandomTokens(32, 1),
                          callbacks=[callback, *more_callbacks(core_context)])
        trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)


if __name__ == "__main__":
    main()
