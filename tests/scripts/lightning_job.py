"""An unmodified Lightning script: Trainer.fit with a WandbLogger, a DataLoader with
persistent workers and OnExceptionCheckpoint. Prints READY mid-fit (the test then sends
SIGTERM), ON_EXCEPTION from a callback's on_exception, PIDS: (DataLoader workers) and
CORE: (wandb-core). Usage: lightning_job.py CHECKPOINT_DIR
"""

import os
import sys
import time

import lightning.pytorch as pl
import psutil
import torch
from lightning.pytorch.callbacks import Callback, OnExceptionCheckpoint
from lightning.pytorch.loggers import WandbLogger
from torch.utils.data import DataLoader, TensorDataset

checkpoints = sys.argv[1]


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        time.sleep(0.05)  # a step takes a while, so the SIGTERM lands mid-fit
        (x,) = batch
        loss = self.layer(x).pow(2).mean()
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Report(Callback):
    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if batch_idx == 5 and trainer.current_epoch == 0:
            loader = trainer.train_dataloader
            workers = getattr(getattr(loader, "_iterator", None), "_workers", [])
            print("PIDS:", *[w.pid for w in workers], flush=True)
            print("CORE:", *[p.pid for p in psutil.process_iter(["name", "ppid"]) if p.info["ppid"] == psutil.Process().pid and p.info["name"] == "wandb-core"], flush=True)
            print("READY", flush=True)

    def on_exception(self, trainer, module, exception):
        print("ON_EXCEPTION:", type(exception).__name__, flush=True)


loader = DataLoader(TensorDataset(torch.randn(4096, 4)), batch_size=8, num_workers=2, persistent_workers=True)
trainer = pl.Trainer(max_epochs=100, logger=WandbLogger(project="autoteardown-tests", name="main", save_dir=os.environ["WANDB_DIR"]),
                     callbacks=[Report(), OnExceptionCheckpoint(dirpath=checkpoints, filename="on_exception")],
                     accelerator="cpu", devices=1, enable_progress_bar=False, enable_model_summary=False,
                     log_every_n_steps=1, default_root_dir=checkpoints)
trainer.fit(Model(), loader)
