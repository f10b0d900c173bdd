"""An actor iterates a DataLoader (2 fork workers, timeout TIMEOUT_S) whose items each run a
subprocess: the workers start processes before the actor has started one of its own.
Prints ITEMS: <n> <seconds> and PIDS: the actor's, then ends normally."""

import os
import subprocess
import time

import ray
import torch.utils.data

ITEMS = int(os.environ.get("ITEMS", "20"))
TIMEOUT_S = float(os.environ.get("TIMEOUT_S", "60"))


class Runs(torch.utils.data.Dataset):
    def __len__(self):
        return ITEMS

    def __getitem__(self, index):
        subprocess.run(["true"], check=True)
        return index


@ray.remote(num_cpus=0)
class Loader:
    def load(self):
        began = time.monotonic()
        loader = torch.utils.data.DataLoader(Runs(), num_workers=2, timeout=TIMEOUT_S,
                                             multiprocessing_context="fork")
        items = sum(1 for _ in loader)
        return os.getpid(), items, time.monotonic() - began


ray.init(num_cpus=2, include_dashboard=False)
loader = Loader.remote()
pid, items, took = ray.get(loader.load.remote())
print(f"PIDS: {pid}", flush=True)
print(f"ITEMS: {items} {took:.2f}", flush=True)
